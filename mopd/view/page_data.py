"""The page's data: a question list to filter, and each workflow's tree compressed until opened.

The list is plain JSON, small (a few numbers and the final answer per workflow) so that filtering
20,000 workflows is a loop over arrays. Each workflow's tree (``timeline.workflow_tree``, with its
token texts and values) is zlib-compressed JSON in base64, inflated by the browser
(``DecompressionStream``) only when the workflow is opened. Role prompts, the same in every call of
a role, are kept once. The file is bounded: once the compressed trees pass ``max_bytes``, later
workflows keep their texts but not their tokens, and the page says how many kept them.
"""

from __future__ import annotations

import base64
import json
import zlib
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

from mopd.core.roles import role_names
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
    """[dataset, id, question, gold answers] of each question, in first-seen order."""
    workflows: List[list] = field(default_factory=list)
    """[system, question, attempt, correct, roles, invalid roles, searches, final answer, step] each."""
    trees: List[str] = field(default_factory=list)
    """Each workflow's compressed tree (base64 of zlib'd JSON), in ``workflows`` order."""
    prompts: List[str] = field(default_factory=list)
    signals: List[str] = field(default_factory=list)
    with_tokens: int = 0
    """Workflows whose token texts and values were kept."""
    past_bound: int = 0
    """Workflows built after the trees passed ``max_bytes`` (their tokens left out)."""
    tree_bytes: int = 0
    max_bytes: int = 0

    def as_json(self) -> str:
        body = {k: getattr(self, k) for k in ("systems", "questions", "workflows", "trees", "prompts", "signals",
                                              "with_tokens", "tree_bytes", "max_bytes")}
        body["roles"] = list(role_names())
        body["scale"] = SCALE
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")


class _Prompts:
    def __init__(self, table: List[str]):
        self.table, self.index = table, {}

    def __call__(self, text: str) -> int:
        if text not in self.index:
            self.index[text] = len(self.table)
            self.table.append(text)
        return self.index[text]


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


def build_page_data(systems: List[System], max_bytes: int = 100 * 2 ** 20) -> PageData:
    """Every workflow of every system, trees compressed, tokens kept until ``max_bytes``."""
    data = PageData(max_bytes=max_bytes)
    prompts = _Prompts(data.prompts)
    q_index: Dict[Tuple[str, str], int] = {}
    signals: set = set()
    for s, system in enumerate(systems):
        data.systems.append({"name": system.name, "source": system.source})
        for wf in system.workflows:
            rec = wf.record
            key = (rec.get("dataset", ""), rec["question_id"])
            if key not in q_index:
                q_index[key] = len(data.questions)
                data.questions.append([key[0], key[1], rec.get("question", ""), rec.get("answers") or []])
            tree = workflow_tree(rec, prompts)
            tree.update(system=s, attempt=rec.get("attempt", 0), workflow=rec.get("workflow", ""),
                        method=rec.get("method", ""), steps=rec.get("steps", 0), duration=rec.get("duration_s", 0.0),
                        candidates=rec.get("candidates") or [], final=rec.get("final_answer"),
                        correct=correct(rec), step=wf.step,
                        rewards={cid: {k: v for k, v in c.items() if k != "tokens"} for cid, c in wf.calls.items()})
            if data.tree_bytes >= max_bytes:
                data.past_bound += 1
            elif _attach_tokens(tree, rec, wf, system.decoder, signals):
                data.with_tokens += 1
            blob = base64.b64encode(zlib.compress(json.dumps(tree, ensure_ascii=False).encode(), 6)).decode()
            data.tree_bytes += len(blob)
            data.trees.append(blob)
            data.workflows.append(_summary(s, q_index[key], rec, wf.step))
    data.signals = [s for s in SIGNALS if s in signals]
    return data
