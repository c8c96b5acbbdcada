"""Multi-turn calls under the chat templates of the families users train (tests/helpers/chat_templates.py),
over the tiny tokenizer: every call is token-exact against the template's own rendering, both
workflows finish, and a template that cannot be continued is refused in one line at start."""

import pytest

from mopd.core.records import WorkflowRecord
from mopd.rollout import prompts
from mopd.rollout.chat import ChatTemplateError, chat_format, check_chat_template, fold_system, render_ids
from tests.helpers.chat_templates import PROMPT_STABLE, TEMPLATES
from tests.helpers.prompts import role_of
from tests.helpers.workflows import check_call_layout, run_scripted

THINK = "I should look this up first.\n</think>\n\n"
"""What a Thinking model writes after its generation prompt opened the block."""


@pytest.fixture(scope="module", params=sorted(TEMPLATES))
def templated(request, tiny_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    tok.chat_template, kwargs = TEMPLATES[request.param]
    return request.param, tok, kwargs


def _scripted(name):
    """A team that searches once, reports, delegates two subtasks, selects both and answers; a
    Thinking model's outputs open with its reasoning and ``</think>``."""
    lead = THINK if name == "qwen3_2507_thinking" else ""

    def respond(prompt, params):
        role = role_of(prompt)
        if role == "searcher":
            if "Doc 1(Title:" in prompt:   # passages came back (the system prompt names <information> too)
                return lead + "<report>Band 0 was formed in Town0.</report>"
            return lead + "<search>band 0 formed</search>"
        if role == "leader":
            if "Report 2 (task:" in prompt:
                return lead + "<select>1,2</select>"
            return lead + "<subtask>where was band 0 formed</subtask><subtask>where was band 1 formed</subtask>"
        return lead + "<answer>Town0</answer>"
    return respond


def _messages_of(call, fmt, tok, first_messages):
    """The conversation a call holds: its first messages, then each model turn as an assistant
    message and each environment turn's content as a user message. A model turn's EOS is dropped
    where the template's turn end writes it; an EOS of another text (the tiny tokenizer's
    ``<|im_end|>`` under Llama 3's ``<|eot_id|>``) stays, as it stays in the trained ids."""
    msgs = list(first_messages)
    for prev, seg in zip(call.segments, call.segments[1:]):
        if seg.source == "model":
            text = tok.decode(seg.token_ids)
            if seg.token_ids[-1] == tok.eos_token_id and fmt.turn_end.startswith(tok.eos_token):
                text = text[:-len(tok.eos_token)]
            msgs.append({"role": "assistant", "content": text})
        else:
            text = seg.text
            ended = tok.decode(prev.token_ids[-1:]) if prev.token_ids[-1] == tok.eos_token_id else ""
            head = fmt.turn_end[len(ended):] if ended and fmt.turn_end.startswith(ended) else fmt.turn_end
            assert text.startswith(head) and text.endswith(fmt.user_suffix), (text, head, fmt.user_suffix)
            msgs.append({"role": "user", "content": text[len(head):len(text) - len(fmt.user_suffix)]})
    return msgs


def _first_messages(call, record):
    if call.role == "searcher":
        return prompts.searcher_messages(record.question, None if call.parent == record.question else call.parent)
    if call.role == "leader":
        return prompts.leader_messages(record.question)
    reports = [e.text for e in record.events_of("report")]
    return prompts.answerer_messages(record.question, reports[:2] if record.workflow == "hmas" else reports[:1])


def _check_call(call, record: WorkflowRecord, name, tok, kwargs):
    fmt = chat_format(tok, kwargs)
    check_call_layout(call, tok)
    first = _first_messages(call, record)
    assert call.segments[0].token_ids == render_ids(tok, first, kwargs)
    msgs = _messages_of(call, fmt, tok, first)
    if not fmt.system_role:
        first = fold_system(first)
    ids = []
    for k, seg in enumerate(call.segments):
        if seg.source == "model":
            # The context of this turn, as the template renders the conversation so far.
            convo = fold_system(msgs[:k + 1]) if not fmt.system_role else msgs[:k + 1]
            expected = tok.apply_chat_template(convo, tokenize=False, add_generation_prompt=True, **kwargs)
            seen = tok.decode(ids)
            if name in PROMPT_STABLE:
                assert seen == expected
            else:
                # Qwen3's hybrid and Thinking templates drop an earlier turn's think block from
                # their history; every prompt still ends as the template's own does.
                assert seen.endswith(expected[expected.rindex(msgs[k]["content"]) + len(msgs[k]["content"]):])
        ids += seg.token_ids
    assert ids == call.token_ids()


@pytest.mark.parametrize("workflow", ["cmas", "hmas"])
def test_both_workflows_finish_token_exactly_under_each_template(templated, workflow):
    name, tok, kwargs = templated
    records, _engine, retriever = run_scripted(tok, _scripted(name), workflow=workflow,
                                               chat_template_kwargs=tuple(kwargs.items()))
    (rec,) = records
    assert rec.final_answer == "Town0"
    # every Searcher searched once and reported after its passages: two turns, an environment turn between
    assert sum(len(b) for b in retriever.batches) == (1 if workflow == "cmas" else 2)
    assert all([s.source for s in c.segments] == ["env", "model", "env", "model"]
               for c in rec.calls if c.role == "searcher")
    assert not any(c.invalid for c in rec.calls), [e.text for e in rec.events_of("invalid")]
    roles = [c.role for c in rec.calls]
    assert roles == (["searcher", "answerer"] if workflow == "cmas" else ["leader", "searcher", "searcher",
                                                                          "answerer"])
    for call in rec.calls:
        _check_call(call, rec, name, tok, kwargs)
    if name == "qwen3_2507_thinking":   # the reasoning stays in the trained tokens
        assert all("I should look this up first." in o for c in rec.calls for o in c.outputs())


def test_template_kwargs_reach_every_rendering(tiny_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    tok.chat_template = TEMPLATES["qwen3_hybrid"][0]
    off = tok.decode(prompts.render_searcher_prompt(tok, "Q?", template_kwargs={"enable_thinking": False}))
    on = tok.decode(prompts.render_searcher_prompt(tok, "Q?"))
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") and on.endswith("<|im_start|>assistant\n")
    assert chat_format(tok, {"enable_thinking": False}).user_suffix.endswith("<think>\n\n</think>\n\n")
    assert not chat_format(tok).user_suffix.endswith("</think>\n\n")


def test_a_template_without_a_system_role_gets_the_system_prompt_in_the_first_user_turn(tiny_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    tok.chat_template = TEMPLATES["no_system"][0]
    text = tok.decode(prompts.render_leader_prompt(tok, "Which band is older?"))
    assert text.startswith("<bos><start_of_turn>user\n" + prompts.LEADER_SYSTEM + "\n\nQuestion: Which band")
    assert not chat_format(tok).system_role


class _Tok:
    """A tokenizer stand-in with a given template renderer."""

    eos_token = "<e>"

    def __init__(self, render, template="odd"):
        self.render, self.chat_template = render, template

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False, **kw):
        return self.render(messages, add_generation_prompt)

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


@pytest.mark.parametrize("render, why", [
    (lambda m, g: "|".join(x["role"] for x in m), "contents verbatim"),
    (lambda m, g: "".join(f"<{x['role']}>{x['content']}" for x in m[:-1]) + ("<gen>" if g else ""), "contents"),
    (lambda m, g: "".join(f"<{x['role']}>{x['content']}</>" for x in m) + ("<gen>" if g and len(m) < 3 else
                                                                           "<gen2>" if g else ""), "differently"),
])
def test_a_template_that_cannot_be_continued_is_one_line_naming_the_model(render, why):
    with pytest.raises(ChatTemplateError, match=why) as e:
        check_chat_template(_Tok(render), name="my-model")
    assert str(e.value).startswith("my-model: ") and "\n" not in str(e.value)


def test_a_tokenizer_without_a_template_is_refused():
    with pytest.raises(ChatTemplateError, match="no chat template"):
        chat_format(_Tok(lambda m, g: "", template=None))
