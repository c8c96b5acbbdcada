"""The token-exactness check of recorded calls, against a real tokenizer and chat template.

Each call's text is rebuilt from its record alone, the way the agents build it, but from the
pieces, not by re-running the agents: its first prompt from the role's messages
(``mopd.rollout.prompts``: the question or subtask, whether the first turn was forced), each later
environment turn from the feedback functions over what the record says happened after the
previous model turn (the passages of its search, an invalid action, the reports of the wave the
Leader sent, a forced last turn). Then:

- segments alternate env, model, env, ...; model segments carry one sampling log-prob per token,
  environment segments none (they are loss-mask 0);
- the first segment's ids are the chat template's rendering of the messages (``render_ids``), and
  its text is the template's own text rendering (``apply_chat_template(tokenize=False)``);
- every later environment segment's ids are ``continuation_ids`` of the rebuilt content, after a
  model turn that did or did not end on one of the engine's EOS ids;
- the decoded ids of the whole call equal the concatenation of those texts and the model's;
- for templates whose history rendering is stable (``whole=True``), the decoded call also equals
  the template applied to the whole conversation (assistant contents = the model's turns), up to
  the text the template writes after the last assistant turn.
"""

from __future__ import annotations

from typing import List, Optional

from mopd.core.actions import parse_leader, parse_searcher, search_queries
from mopd.rollout.chat import chat_format, continuation_ids, fold_system, render_ids
from mopd.rollout.prompts import (
    Report,
    answerer_messages,
    leader_feedback,
    leader_messages,
    searcher_feedback,
    searcher_messages,
)


class Turns:
    """A call's segments split into its first prompt, model turns and environment turns."""

    def __init__(self, call):
        segs = call.segments
        assert segs and segs[0].source == "env", f"{call.call_id}: a call starts with its prompt"
        for i, s in enumerate(segs):
            want = "env" if i % 2 == 0 else "model"
            assert s.source == want, f"{call.call_id}: segment {i} is {s.source}, expected {want}"
            if s.source == "model":
                assert s.logprobs is not None and len(s.logprobs) == len(s.token_ids) > 0, (
                    f"{call.call_id}: model segment {i} has {len(s.token_ids)} ids and "
                    f"{None if s.logprobs is None else len(s.logprobs)} log-probs")
            else:
                assert s.logprobs is None, f"{call.call_id}: environment segment {i} has log-probs"
        assert segs[-1].source == "model", f"{call.call_id}: a call ends with a model turn"
        self.prompt = segs[0]
        self.model = segs[1::2]
        self.env = segs[2::2]
        """env[i] follows model[i]."""


def _forced_last(record, call, texts) -> bool:
    """Whether the call's last turn was forced (a Searcher's 'step', a Leader's 'round'/'step' limit):
    the agent emits that limit event when it asks for the forced turn, and a forced turn is the last."""
    return any(e.kind == "limit" and e.call_id == call.call_id and e.text in texts for e in record.events)


def _searcher_contents(record, call, turns) -> List[str]:
    forced = _forced_last(record, call, ("step",))
    searches = [e for e in record.events if e.kind == "search" and e.call_id == call.call_id]
    contents = []
    for i, seg in enumerate(turns.model[:-1]):
        force_next = forced and i + 1 == len(turns.model) - 1
        action = parse_searcher(seg.text)
        if action.kind == "search":   # run: its passages come back in the next turn (not on a forced turn)
            event = searches.pop(0)
            assert event.text == action.text, (call.call_id, event.text, action.text)
            contents.append(searcher_feedback(event.passages, force_report=force_next))
        else:
            assert action.kind == "invalid", f"{call.call_id}: a report ends the call, yet it went on"
            del searches[:len(search_queries(seg.text))]   # queries of an invalid output, counted, not run
            contents.append(searcher_feedback(None, invalid=True, force_report=force_next))
    return contents


def _searcher_messages(record, call, turns) -> List[dict]:
    forced_first = _forced_last(record, call, ("step",)) and len(turns.model) == 1
    subtask = call.parent if record.workflow == "hmas" else None
    return searcher_messages(record.question, subtask, force_report=forced_first)


def _leader_contents(record, call, turns) -> List[str]:
    forced = _forced_last(record, call, ("round", "step"))
    reports: List[Report] = []
    contents, wave = [], 0
    for i, seg in enumerate(turns.model[:-1]):
        force_next = forced and i + 1 == len(turns.model) - 1
        action = parse_leader(seg.text, len(reports))
        if action.kind == "subtasks":
            searchers = [c for c in record.calls if c.role == "searcher" and c.call_id.startswith(f"s{wave}.")]
            searchers.sort(key=lambda c: int(c.call_id.split(".")[1]))
            # the wave's Searchers, one per subtask (beyond rollout.max_searchers_per_wave: dropped)
            assert searchers and [c.parent for c in searchers] == list(action.subtasks[:len(searchers)])
            new = []
            for c in searchers:
                said = [e.text for e in record.events if e.kind == "report" and e.call_id == c.call_id]
                new.append(Report(index=len(reports) + 1, subtask=c.parent, text=said[0] if said else ""))
                reports.append(new[-1])
            wave += 1
            contents.append(leader_feedback(new, force_select=force_next))
        else:
            assert action.kind == "invalid", f"{call.call_id}: a select ends the Leader, yet it went on"
            contents.append(leader_feedback((), invalid=True, force_select=force_next))
    return contents


def _answerer_messages(record, call) -> List[dict]:
    if record.workflow == "cmas":
        searcher = next(c for c in record.calls if c.role == "searcher")
        said = [e.text for e in record.events if e.kind == "report" and e.call_id == searcher.call_id]
        return answerer_messages(record.question, [said[0] if said else ""])
    select = [e for e in record.events if e.kind == "select"][-1]
    texts = []
    for c in sorted((c for c in record.calls if c.role == "searcher"),
                    key=lambda c: tuple(int(x) for x in c.call_id[1:].split("."))):
        said = [e.text for e in record.events if e.kind == "report" and e.call_id == c.call_id]
        texts.append(said[0] if said else "")
    return answerer_messages(record.question, [texts[i - 1] for i in select.selection])


def rebuild(record, call):
    """(first messages, the content of each later environment turn) of ``call``, from ``record``."""
    turns = Turns(call)
    if call.role == "searcher":
        return _searcher_messages(record, call, turns), _searcher_contents(record, call, turns)
    if call.role == "leader":
        forced_first = _forced_last(record, call, ("round", "step")) and len(turns.model) == 1
        return leader_messages(record.question, force_select=forced_first), _leader_contents(record, call, turns)
    assert call.role == "answerer" and len(turns.model) == 1, f"{call.call_id}: an answerer call is one turn"
    return _answerer_messages(record, call), []


def check_call(record, call, tokenizer, eos_ids, template_kwargs: Optional[dict] = None,
               whole: bool = False) -> None:
    """Assert that ``call`` is token-exact under ``tokenizer``'s chat template (module docstring)."""
    kw = dict(template_kwargs or {})
    turns = Turns(call)
    assert not call.truncated_input or len(turns.model) > 0
    messages, contents = rebuild(record, call)
    assert len(contents) == len(turns.env), (call.call_id, len(contents), len(turns.env))
    fmt = chat_format(tokenizer, kw)
    shown = messages if fmt.system_role else fold_system(messages)
    first = tokenizer.apply_chat_template(shown, tokenize=False, add_generation_prompt=True, **kw)
    assert not call.truncated_input, f"{call.call_id}: its first prompt was cut (raise max_input_tokens)"
    assert turns.prompt.token_ids == render_ids(tokenizer, messages, kw), f"{call.call_id}: first prompt ids"
    assert tokenizer.decode(turns.prompt.token_ids) == first, f"{call.call_id}: first prompt text"
    expected = first
    for model, env, content in zip(turns.model, turns.env + [None], contents + [None]):
        expected += tokenizer.decode(model.token_ids)
        if env is None:
            break
        eos = model.token_ids[-1] in eos_ids
        want = continuation_ids(tokenizer, content, after_eos=eos, template_kwargs=kw,
                                eos_text=tokenizer.decode([model.token_ids[-1]]) if eos else "")
        assert env.token_ids == want, (f"{call.call_id}: environment turn ids differ from the continuation of "
                                       f"{content[:60]!r}")
        expected += tokenizer.decode(want)
    assert tokenizer.decode(call.token_ids()) == expected, f"{call.call_id}: decoded call"
    if whole:
        _check_whole(call, turns, shown, contents, tokenizer, eos_ids, kw, fmt)


_PROBE = "\nPROBECONTENT7 \n"


def trims_assistant(tokenizer, shown, kw) -> bool:
    """Whether the template strips the whitespace around an assistant message's content (Llama 3's
    and Gemma's do: ``content | trim``)."""
    text = tokenizer.apply_chat_template(list(shown) + [{"role": "assistant", "content": _PROBE}], tokenize=False,
                                         add_generation_prompt=False, **kw)
    assert _PROBE.strip() in text
    return _PROBE not in text


def _check_whole(call, turns, shown, contents, tokenizer, eos_ids, kw, fmt) -> None:
    """The call against the template applied to the whole conversation. The model's EOS is the one
    token the template does not write where its turn end does not start with it (a ChatML model
    under a Llama 3 template ends on <|im_end|>; the template closes the turn with <|eot_id|>). A
    template that trims an assistant turn's content re-renders a model turn that starts or ends with
    whitespace without it (SmolLM2 often opens a turn with a newline): the comparison trims it too;
    the environment's text around it must match exactly."""
    trim = trims_assistant(tokenizer, shown, kw)
    conv, decoded = list(shown), tokenizer.decode(turns.prompt.token_ids)
    ended = ""
    for i, model in enumerate(turns.model):
        ids = list(model.token_ids)
        ended = ""
        if ids[-1] in eos_ids:
            ended = tokenizer.decode(ids[-1:])
            ids = ids[:-1]
        text = tokenizer.decode(ids)
        conv.append({"role": "assistant", "content": text})
        decoded += text.strip() if trim else text
        if not fmt.turn_end.startswith(ended):
            ended = ""           # not written by the template: dropped from the comparison
        decoded += ended
        if i < len(turns.env):
            conv.append({"role": "user", "content": contents[i]})
            decoded += tokenizer.decode(turns.env[i].token_ids)
    rendered = tokenizer.apply_chat_template(conv, tokenize=False, add_generation_prompt=False, **kw)
    assert rendered.startswith(decoded), f"{call.call_id}: the whole-conversation rendering differs"
    tail = rendered[len(decoded):]
    assert fmt.turn_end.startswith(ended + tail), (
        f"{call.call_id}: after the last model turn the template writes {tail!r}, not the start of "
        f"{fmt.turn_end!r}")


def check_records(records, tokenizer, eos_ids, template_kwargs=None, whole: bool = False) -> int:
    """Check every call of ``records``; the number of calls checked."""
    n = 0
    for r in records:
        for c in r.calls:
            check_call(r, c, tokenizer, eos_ids, template_kwargs, whole)
            n += 1
    return n
