"""One workflow record as the viewer's tree: its calls split into turns, in time order.

A call's segments alternate environment text (its role prompt first, then passages, reports or
feedback) and model turns; the call's events (searches with their passages, reports, subtasks,
selections, answers, invalid outputs, limits) are grouped by step, the k-th distinct step of a
call being its k-th turn. The blocks of the tree, in step order: each Leader turn, each wave of
Searchers (call ids ``s<wave>.<i>``), any other call, each answering request's candidates
(Answerer calls of one group), then the final answer.

Works on the record's JSON dict (as read from records.jsonl), not on ``WorkflowRecord``: building
the objects costs more than the page does at 20,000 workflows (``mopd.eval.loading``).
"""

from __future__ import annotations

import re
from typing import Dict, List

from mopd.core.roles import role, role_names
from mopd.core.scoring import exact_match, extract_answer

_WAVE = re.compile(r"^s(\d+)\.\d+$")
ENV_PREVIEW = 2000
"""Characters kept of an environment segment other than the role prompt (passages, reports)."""


def invalid_reason(role_name: str, text: str) -> str:
    """Why an output was not a valid action, by the role's own parser (``mopd.core.roles``)."""
    if role_name not in role_names():
        return "invalid"
    parse = role(role_name).parse
    try:
        action = parse(text)
    except TypeError:   # the Leader's parser needs the number of reports: any is fine for a format error
        action = parse(text, n_reports=10 ** 6)
    return action.error or "invalid (a limit or a state rule, not the format)"


def split_role_prompt(role_name: str, text: str):
    """(up to the end of the role's system prompt, the rest: the question, subtask or reports)."""
    system = role(role_name).system_prompt if role_name in role_names() else ""
    at = text.find(system) if system else -1
    if at < 0:
        return text, ""
    cut = at + len(system)
    return text[:cut], text[cut:]


def correct(record: dict) -> bool:
    """Strict exact match of the last candidate's answer (the evaluation's score)."""
    cands = record.get("candidates") or []
    return bool(cands) and exact_match(extract_answer(cands[-1]), record.get("answers") or []) == 1.0


ACTIONS = ("search", "report", "subtask", "select", "answer", "invalid")
"""Event kinds that a model turn's output makes (each turn makes at least one); ``limit`` and
``dropped_subtask`` come from the environment and go with the turn before them."""


def _turns(call: dict, events: List[dict]) -> List[dict]:
    """The call's model turns, each with the environment text before it and its events: the k-th
    turn happened at the k-th distinct step of the call's action events."""
    steps = sorted({e["step"] for e in events if e["kind"] in ACTIONS})
    turns, env = [], []
    for i, seg in enumerate(call.get("segments") or []):
        if seg["source"] == "env":
            env.append((i, seg.get("text", "")))
            continue
        k = len(turns)
        step = steps[k] if k < len(steps) else (turns[-1]["step"] + 1 if turns else call.get("step", 0))
        turns.append({"segment": i, "text": seg.get("text", ""), "step": step, "env": env, "events": []})
        env = []
    if not turns:   # a call without segments (evaluation records read lightly): its events only
        turns = [{"segment": -1, "text": "", "step": s, "env": [], "events": []} for s in steps]
    for e in events:
        if not turns:
            break
        at = max((k for k, t in enumerate(turns) if t["step"] <= e["step"]), default=0)
        turns[at]["events"].append(_event(call["role"], e))
    return turns


def _event(role_name: str, e: dict) -> dict:
    out = {"kind": e["kind"], "text": e.get("text", "")}
    if e["kind"] == "search":
        out["passages"] = [{"title": p.get("title", ""), "text": p.get("text", ""), "id": p.get("id", "")}
                           for p in e.get("passages") or []]
    elif e["kind"] == "select":
        out["selection"] = e.get("selection") or []
    elif e["kind"] == "invalid":
        out["reason"] = invalid_reason(role_name, e.get("text", ""))
    return out


def workflow_tree(record: dict, prompt_index) -> dict:
    """The tree of one workflow: ``calls`` by id (role, counts, turns) and ``blocks`` in time order.
    ``prompt_index(text) -> int`` files each call's role prompt in a table the page shares."""
    events_of: Dict[str, List[dict]] = {}
    loose = []
    for e in record.get("events") or []:
        (events_of.setdefault(e["call_id"], []) if e.get("call_id") else loose).append(e)
    calls, blocks = {}, []
    waves: Dict[int, dict] = {}
    requests: Dict[str, dict] = {}
    for c in record.get("calls") or []:
        cid = c["call_id"]
        turns = _turns(c, events_of.get(cid, []))
        prompt = -1
        if turns and turns[0]["env"]:   # the role's system prompt, shared by its calls, is filed once
            (i, first), rest = turns[0]["env"][0], turns[0]["env"][1:]
            system, task = split_role_prompt(c["role"], first)
            prompt = prompt_index(system)
            turns[0]["env"] = ([(i, task)] if task.strip() else []) + rest
        for t in turns:
            t["env"] = [(i, text if len(text) <= ENV_PREVIEW else text[:ENV_PREVIEW] + " …") for i, text in t["env"]]
        calls[cid] = {"role": c["role"], "step": c.get("step", 0), "parent": c.get("parent", ""),
                      "group": c.get("group", ""), "input_tokens": c.get("input_tokens", 0),
                      "output_tokens": c.get("output_tokens", 0), "invalid": bool(c.get("invalid")),
                      "finish": c.get("finish_reasons") or [], "truncated": bool(c.get("truncated_input")),
                      "prompt": prompt, "turns": turns}
        wave = _WAVE.match(cid) if c["role"] == "searcher" else None
        if c["role"] == "leader":
            for k, t in enumerate(turns):
                blocks.append({"kind": "turn", "call": cid, "turn": k, "step": t["step"]})
        elif wave and record.get("workflow") != "cmas":
            w = int(wave.group(1))
            if w not in waves:
                waves[w] = {"kind": "wave", "wave": w, "step": c.get("step", 0), "calls": []}
                blocks.append(waves[w])
            waves[w]["calls"].append(cid)
        elif c["role"] == "answerer" and c.get("group"):
            g = c["group"]
            if g not in requests:
                requests[g] = {"kind": "request", "group": g, "step": c.get("step", 0), "calls": []}
                blocks.append(requests[g])
            requests[g]["calls"].append(cid)
        else:
            blocks.append({"kind": "call", "call": cid, "step": c.get("step", 0)})
    order = {"turn": 0, "wave": 1, "call": 1, "request": 2}
    blocks.sort(key=lambda b: (b["step"], order[b["kind"]]))
    blocks += [{"kind": "event", "step": e["step"], "event": _event("", e)} for e in loose]
    return {"calls": calls, "blocks": blocks}
