"""The page's data: a question list to filter, and each workflow's tree compressed until opened.

The list is plain JSON, small (a few numbers and the final answer per workflow) so that filtering
20,000 workflows is a loop over arrays. Each workflow's tree (``timeline.workflow_tree``, with its
token texts and values) is zlib-compressed JSON in base64, inflated by the browser
(``DecompressionStream``) only when the workflow is opened. Role prompts, the same in every call of
a role, are kept once.

The data is bounded (``max_bytes``: what the page may hold besides its fixed script, style and
notes; ``mopd view --max-mb``), workflows taken in order: while they fit whole, with their token
texts and values; then with their texts but no tokens; then in the list only, without a tree;
past that, left out. The page says how many went each way (``PageData``'s counts).

A question is one (dataset, id, question text): two sources (or two records) that give one id to
two different questions show them as two questions, each marked, never one scored as the other.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

from mopd.core.roles import role_names
from mopd.view.inline_json import inline_json, no_surrogates
from mopd.view.timeline import correct, workflow_tree
from mopd.view.token_text import SCALE, TokenDecoder, opd_signal, quantise, split_by_turn

SIGNALS = ("opd", "advantage", "teacher", "old", "sampling")
"""The per-token values a page may colour by, in the order offered (the first present is the
default: OPD's teacher-minus-old on Searcher tokens)."""


@dataclass
class Workflow:
    """One workflow to show: its record's dict and what is known per call beyond the record."""

    record: dict
    calls: Dict[str, dict] = field(default_factory=dict)
    """{call id: {"reward", "advantage", "tokens": {signal: [one value per model token]}}} (traces,
    teacher scoring)."""
    step: Optional[int] = None
    """The training step it was traced at (None for an evaluation's records)."""


@dataclass
class System:
    """One records source shown as one column (a system, a training run)."""

    name: str
    workflows: Iterable[Workflow]
    decoder: TokenDecoder = field(default_factory=TokenDecoder)
    source: str = ""
    """Where its records came from (shown in the page)."""


@dataclass
class PageData:
    """What the page embeds (``as_json``) and what the writer says about it."""

    systems: List[dict] = field(default_factory=list)
    questions: List[list] = field(default_factory=list)
    """[dataset, id, question, gold answers, 1 if the id also names another question here] of each
    question, in first-seen order."""
    workflows: List[list] = field(default_factory=list)
    """[system, question, attempt, correct, roles, invalid roles, searches, final answer, step] each."""
    trees: List[str] = field(default_factory=list)
    """Each workflow's compressed tree (base64 of zlib'd JSON), in ``workflows`` order."""
    prompts: List[str] = field(default_factory=list)
    signals: List[str] = field(default_factory=list)
    with_tokens: int = 0
    """Workflows whose token texts and values were kept."""
    past_bound: int = 0
    """Workflows after the first whose tokens did not fit ``max_bytes`` (their tokens left out)."""
    without_tree: int = 0
    """Workflows listed without a tree (not even their texts fitted); their ``trees`` entry is ""."""
    dropped: int = 0
    """Workflows left out of the page (not even their list entry fitted)."""
    tree_bytes: int = 0
    data_bytes: int = 0
    """Bytes of the page's data so far (``as_json``), counted as it grows."""
    max_bytes: int = 0

    def as_json(self) -> str:
        """The data as JSON that can be inlined in the page's script element (``inline_json``)."""
        body = {k: getattr(self, k) for k in ("systems", "questions", "workflows", "trees", "prompts", "signals",
                                              "with_tokens", "tree_bytes", "max_bytes")}
        body["roles"] = list(role_names())
        body["scale"] = SCALE
        return inline_json(body)


def _size(value) -> int:
    """Bytes that ``value`` adds to ``as_json`` as one more list item (its comma included)."""
    return len(inline_json(value).encode()) + 1


class _Prompts:
    def __init__(self, table: List[str]):
        self.table, self.index = table, {}

    def __call__(self, text: str) -> int:
        if text not in self.index:
            self.index[text] = len(self.table)
            self.table.append(text)
        return self.index[text]

    def bytes_since(self, n: int) -> int:
        return sum(_size(t) for t in self.table[n:])

    def forget_since(self, n: int) -> None:
        for t in self.table[n:]:
            del self.index[t]
        del self.table[n:]


def _attach_tokens(tree: dict, record: dict, wf: Workflow, decoder: TokenDecoder, signals: set) -> bool:
    """Token texts and quantised values on every model turn that has token ids; True if any."""
    segments = {c["call_id"]: c.get("segments") or [] for c in record.get("calls") or []}
    any_tokens = False
    for cid, call in tree["calls"].items():
        segs = segments.get(cid, [])
        turns = [t for t in call["turns"] if t["segment"] >= 0]
        ids = [segs[t["segment"]].get("token_ids") or [] for t in turns]
        if not turns or not all(ids):
            continue
        known = dict((wf.calls.get(cid) or {}).get("tokens") or {})
        if "sampling" not in known and any(segs[t["segment"]].get("logprobs") for t in turns):
            known["sampling"] = [v for t in turns for v in (segs[t["segment"]].get("logprobs") or [])]
        if "opd" not in known and opd_signal(known) is not None:
            known["opd"] = opd_signal(known)
        cut = {}
        for name, values in known.items():
            parts = split_by_turn(values, [len(i) for i in ids])
            if parts is not None:
                cut[name] = parts
                signals.add(name)
        for k, t in enumerate(turns):
            t["tokens"] = {"pieces": decoder.pieces(ids[k]) if decoder else [],
                           "values": {name: quantise(parts[k]) for name, parts in cut.items()}}
        any_tokens = True
    return any_tokens


def _summary(sys_index: int, q_index: int, record: dict, step: Optional[int]) -> list:
    names = list(role_names())
    roles = invalid = 0
    for c in record.get("calls") or []:
        if c["role"] in names:
            bit = 1 << names.index(c["role"])
            roles |= bit
            if c.get("invalid"):
                invalid |= bit
    searches = sum(1 for e in record.get("events") or [] if e["kind"] == "search" and e.get("text", "").strip())
    return [sys_index, q_index, record.get("attempt", 0), int(correct(record)), roles, invalid, searches,
            record.get("final_answer") or "", step]


def _blob(tree: dict) -> str:
    return base64.b64encode(zlib.compress(no_surrogates(json.dumps(tree, ensure_ascii=False)).encode(), 6)).decode()


def _drop_tokens(tree: dict) -> None:
    for call in tree["calls"].values():
        for t in call["turns"]:
            t.pop("tokens", None)


def _mark_shared_ids(questions: List[list]) -> None:
    """Set each question's 5th item to 1 where its (dataset, id) also names another question text."""
    seen = Counter((q[0], q[1]) for q in questions)
    for q in questions:
        q[4] = int(seen[(q[0], q[1])] > 1)


def build_page_data(systems: List[System], max_bytes: int = 100 * 2 ** 20) -> PageData:
    """Every workflow of every system, trees compressed, within ``max_bytes`` of data (see the module)."""
    data = PageData(max_bytes=max_bytes)
    prompts = _Prompts(data.prompts)
    q_index: Dict[Tuple[str, str, str], int] = {}
    signals: set = set()
    data.systems = [{"name": system.name, "source": system.source} for system in systems]
    data.data_bytes = len(data.as_json().encode()) + 64 * len(SIGNALS) + 64   # the signals and counts to come
    tokens_fit = trees_fit = True
    for s, system in enumerate(systems):
        for wf in system.workflows:
            if data.dropped:
                data.dropped += 1      # past the bound: the rest are counted, not built
                continue
            rec = wf.record
            key = (rec.get("dataset", ""), rec["question_id"], rec.get("question", ""))
            question = None if key in q_index else [key[0], key[1], key[2], rec.get("answers") or [], 0]
            summary = _summary(s, q_index.get(key, len(data.questions)), rec, wf.step)
            n_prompts = len(data.prompts)
            tree = workflow_tree(rec, prompts)
            fixed = _size(summary) + (_size(question) if question else 0) + prompts.bytes_since(n_prompts) + 3
            if data.data_bytes + fixed > max_bytes:
                prompts.forget_since(n_prompts)
                data.dropped += 1
                continue
            tree.update(system=s, attempt=rec.get("attempt", 0), workflow=rec.get("workflow", ""),
                        method=rec.get("method", ""), steps=rec.get("steps", 0), duration=rec.get("duration_s", 0.0),
                        candidates=rec.get("candidates") or [], final=rec.get("final_answer"),
                        correct=correct(rec), step=wf.step,
                        rewards={cid: {k: v for k, v in c.items() if k != "tokens"} for cid, c in wf.calls.items()})
            blob = ""
            if tokens_fit:
                its_signals: set = set()
                had = _attach_tokens(tree, rec, wf, system.decoder, its_signals)
                blob = _blob(tree)
                if data.data_bytes + fixed + len(blob) <= max_bytes:
                    data.with_tokens += had
                    signals |= its_signals
                else:
                    tokens_fit = False
                    if had:
                        _drop_tokens(tree)
                        blob = _blob(tree)
            if not tokens_fit:
                data.past_bound += 1
                if trees_fit:
                    blob = blob or _blob(tree)
                    trees_fit = data.data_bytes + fixed + len(blob) <= max_bytes
                if not trees_fit:
                    blob = ""
                    data.without_tree += 1
            if question:
                q_index[key] = len(data.questions)
                data.questions.append(question)
            data.data_bytes += fixed + len(blob)
            data.tree_bytes += len(blob)
            data.trees.append(blob)
            data.workflows.append(summary)
    data.signals = [s for s in SIGNALS if s in signals]
    _mark_shared_ids(data.questions)
    return data
