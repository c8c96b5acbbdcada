"""``mopd view --teacher DIR``: an evaluation's Searcher tokens scored by a teacher, once, no step.

The trainer's own scoring path does it: the Searcher calls are packed into micro-batches
(``train.step_batches.pack_records``), the teacher (``train.teacher.Teacher``) gives each token's
log-prob, and the values are read back per call (``train.token_trace.call_token_values``). pi_old
is the evaluated model's log-prob of the same tokens when its directory is known (the
evaluation's ``run.json``), else the records' sampling log-probs (at the evaluation's temperature,
so only roughly the trainer's). OPD's signal is then teacher minus old, as in training.

Records written without token ids (``mopd eval run`` without ``--keep-token-ids``) are tokenised
here segment by segment with the teacher's tokenizer, as the rollout tokenises them; the page then
says nothing is lost but the engine's sampling log-probs.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch
from transformers import AutoTokenizer

from mopd.core.adapter_dir import tokenizer_dir
from mopd.core.records import WorkflowRecord
from mopd.train.step_batches import pack_records
from mopd.train.teacher import Teacher
from mopd.train.token_trace import call_token_values
from mopd.view.page_data import Workflow

ROLE = "searcher"


def _with_ids(record: dict, tokenizer) -> dict:
    """The record's Searcher calls only, every segment with token ids (tokenised where absent)."""
    calls = []
    for c in record.get("calls") or []:
        if c["role"] != ROLE:
            continue
        segs = []
        for s in c.get("segments") or []:
            if not s.get("token_ids"):
                s["token_ids"] = tokenizer.encode(s.get("text", ""), add_special_tokens=False)
                s["logprobs"] = None
            segs.append(s)
        calls.append({**c, "segments": segs})
    return {**record, "calls": calls}


def score_searchers(workflows: Sequence[Workflow], teacher_dir: str, *, student_dir: Optional[str] = None,
                    temperature: float = 1.0, budget: int = 8192) -> List[Workflow]:
    """``workflows`` with teacher (and pi_old) log-probs on every Searcher model token, in place."""
    device = torch.device(f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir(teacher_dir))   # an adapter: its base's
    # "auto": bf16 on a GPU, fp32 on CPU, as the trainer scores
    teacher = Teacher(teacher_dir, student_tokenizer=tokenizer, device=device, dtype="auto")
    student = Teacher(student_dir, student_tokenizer=tokenizer, device=device, dtype="auto") if student_dir \
        else None
    records = [WorkflowRecord.from_dict(_with_ids(wf.record, tokenizer), "record") for wf in workflows]
    step = pack_records(records, budget, device=device, pad_id=tokenizer.pad_token_id or 0)
    teacher_lp = [teacher.logprobs(b, temperature) for b in step.batches]
    old_lp = [student.logprobs(b, temperature) for b in step.batches] if student else \
        [b.sampling_logp for b in step.batches]
    has_sampling = [any(s.logprobs for s in r.call.segments if s.trainable) for r in step.refs]
    for ref, sampled in zip(step.refs, has_sampling):
        tokens = {"teacher": call_token_values(step, ref, teacher_lp[ref.batch])}
        if student is not None or sampled:
            tokens["old"] = call_token_values(step, ref, old_lp[ref.batch])
        workflows[ref.record].calls.setdefault(ref.call.call_id, {})["tokens"] = tokens
    return list(workflows)
