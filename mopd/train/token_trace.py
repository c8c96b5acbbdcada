"""The per-token learning signal of a training step, kept for people to read (``mopd view``).

Every ``trainer.trace_every`` steps the trainer appends to ``<run>/traces.jsonl`` one line per
sampled workflow of the step: the workflow's record (token ids included) and, per call, its role
reward and advantage and, for each model token in order, the engine's sampling log-prob, pi_old,
the teacher's log-prob (on the roles a teacher scores) and the advantage the loss used for it
(``learning_signal.trained_advantages``: OPD's ``opd_coef * (teacher - old)`` on an OPD role).

Tracing only reads what the step computed and writes a file: it draws no random number and
changes no tensor, so a traced run trains exactly as an untraced one. The sample is fixed, not
drawn: the first workflow of each of the step's first ``trainer.trace_workflows`` groups. Each
line is one ``write`` on a file opened for appending, as ``metrics.jsonl``'s are.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

from mopd.core.roles import role_names
from mopd.train.learning_signal import trained_advantages
from mopd.train.step_batches import CallRef, StepBatches

TRACES_FILE = "traces.jsonl"
DIGITS = 4
"""Decimals kept of each per-token value (log-probs to 1e-4 nats)."""


def traced_records(records: Sequence, count: int) -> List[int]:
    """Indices of the first workflow of each of the first ``count`` groups (question and group id),
    in record order: a fixed sample, no random draw."""
    seen, out = set(), []
    for i, rec in enumerate(records):
        key = (rec.question_id, rec.group_id)
        if key in seen:
            continue
        seen.add(key)
        out.append(i)
        if len(out) == count:
            break
    return out


def call_token_values(step: StepBatches, ref: CallRef, values: torch.Tensor) -> List[float]:
    """``values`` (one per packed position of ``ref``'s micro-batch) at the call's model tokens, in
    order. Position i of a sequence holds the value of the token it predicts (i + 1); a call's
    first token is never a model token (it starts with its prompt)."""
    batch = step.batches[ref.batch]
    at = (batch.seq_ids == ref.seq).nonzero().flatten()
    mask = torch.tensor(ref.call.loss_mask()[1:], dtype=torch.bool)
    picked = values.detach()[at[:-1]].float().cpu()[mask]
    return [round(float(v), DIGITS) for v in picked]


def trace_lines(step_no: int, records: Sequence, step: StepBatches, role_specs: Sequence, *,
                rewards: Sequence[Dict[str, float]], advantages: Sequence[Dict[str, float]],
                teacher_roles: Sequence[str], count: int) -> List[dict]:
    """The trace of ``count`` of the step's workflows, one dict per workflow (see the module)."""
    chosen = traced_records(records, count)
    wanted = set(chosen)
    adv_by_batch = {}
    calls: Dict[int, Dict[str, dict]] = {i: {} for i in chosen}
    for ref in step.refs:
        if ref.record not in wanted or ref.batch < 0:
            continue
        batch = step.batches[ref.batch]
        if ref.batch not in adv_by_batch:
            adv_by_batch[ref.batch] = trained_advantages(batch, role_specs)
        tokens = {"sampling": call_token_values(step, ref, batch.sampling_logp),
                  "advantage": call_token_values(step, ref, adv_by_batch[ref.batch])}
        if batch.old_logp is not None:
            tokens["old"] = call_token_values(step, ref, batch.old_logp)
        if batch.teacher_logp is not None and ref.call.role in teacher_roles:
            tokens["teacher"] = call_token_values(step, ref, batch.teacher_logp)
        cid = ref.call.call_id
        calls[ref.record][cid] = {"reward": _maybe(rewards[ref.record].get(cid)),
                                  "advantage": _maybe(advantages[ref.record].get(cid)), "tokens": tokens}
    return [{"step": step_no, "time": time.time(), "roles": list(role_names()),
             "record": records[i].to_dict(), "calls": calls[i]} for i in chosen]


def _maybe(v: Optional[float]) -> Optional[float]:
    return None if v is None else round(float(v), 6)


def cut_back_to_last_line(path: Path) -> int:
    """Drop a cut last line of ``path`` (bytes after its last newline: a kill mid-write), so that
    what is appended next starts a line of its own; returns the bytes dropped."""
    with path.open("r+b") as f:
        end = f.seek(0, os.SEEK_END)
        at = end
        while at > 0:
            start = max(0, at - 65536)
            f.seek(start)
            chunk = f.read(at - start)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                at = start + nl + 1
                break
            at = start
        if at < end:
            f.truncate(at)
        return end - at


def append_traces(run_dir: str | os.PathLike, lines: Sequence[dict]) -> Path:
    """Append ``lines`` to ``<run_dir>/traces.jsonl``, each in one write (a reader sees whole lines
    but possibly a cut last one after a kill, which ``mopd view`` skips). A cut last line is
    dropped first (as ``metrics.jsonl``'s is on resume): else the next line would be glued to it
    and lost with it."""
    path = Path(run_dir) / TRACES_FILE
    if path.is_file():
        cut_back_to_last_line(path)
    with path.open("a", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    return path
