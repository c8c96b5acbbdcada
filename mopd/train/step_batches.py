"""From a step's records and scored micro-batches to the per-token training signals.

This is the glue between the pure method (``mopd.algo``) and the packed tensors: it sums the
per-token ``old_logp - teacher_logp`` of every call (for KL in reward), asks the critic when the
preset uses one, computes role rewards and role-wise advantages, and writes each call's
advantage onto its model-written positions of the packed batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from mopd.algo.advantages import role_advantages
from mopd.algo.rewards import kl_in_reward, role_rewards
from mopd.config import Config
from mopd.core.records import AgentCall, WorkflowRecord
from mopd.train.packing import PackedBatch


@dataclass
class CallRef:
    """Where a call lives: its record, and its place in the packed micro-batches."""

    record: int
    call: AgentCall
    batch: int = -1
    seq: int = -1


def per_call_sums(refs: Sequence[CallRef], batches: Sequence[PackedBatch], values: Sequence[torch.Tensor]
                  ) -> Dict[Tuple[int, str], float]:
    """Sum of ``values`` over each call's trained positions: {(record, call_id): sum}."""
    out: Dict[Tuple[int, str], float] = {}
    by_batch: Dict[int, List[CallRef]] = {}
    for r in refs:
        by_batch.setdefault(r.batch, []).append(r)
    for b, members in by_batch.items():
        batch, v = batches[b], values[b]
        trained = (batch.roles >= 0).to(v.dtype)
        n_seq = int(batch.seq_ids.max()) + 1
        sums = torch.zeros(n_seq, dtype=torch.float64).index_add_(0, batch.seq_ids.cpu(),
                                                                  (v * trained).double().cpu())
        for r in members:
            out[(r.record, r.call.call_id)] = float(sums[r.seq])
    return out


def compute_advantages(cfg: Config, records: Sequence[WorkflowRecord], refs: Sequence[CallRef],
                       batches: Sequence[PackedBatch], old_logp: Sequence[torch.Tensor],
                       teacher_logp: Optional[Sequence[torch.Tensor]],
                       judge: Optional[Dict[Tuple[int, str], float]] = None
                       ) -> Tuple[List[Dict[str, float]], List[Dict[str, float]]]:
    """Role rewards (after KL in reward) and advantages of every call, per record."""
    kl_sums: Dict[Tuple[int, str], float] = {}
    if cfg.reward.kl_coef > 0 and cfg.reward.kl_roles:
        if teacher_logp is None:
            raise ValueError(f"KL in reward for {cfg.reward.kl_roles} needs teacher log-probs; set teacher.path")
        diffs = [o - t for o, t in zip(old_logp, teacher_logp)]
        kl_sums = per_call_sums(refs, batches, diffs)
    rewards: List[Dict[str, float]] = []
    for i, rec in enumerate(records):
        rec_judge = None
        if judge is not None:
            rec_judge = {cid: v for (ri, cid), v in judge.items() if ri == i}
        r = role_rewards(rec, cfg.reward, rec_judge)
        if kl_sums:
            r = kl_in_reward(r, rec, {cid: v for (ri, cid), v in kl_sums.items() if ri == i},
                             cfg.reward.kl_roles, cfg.reward.kl_coef)
        rewards.append(r)
    per_call = ("searcher",) if cfg.reward.searcher == "critic" else ()
    advs = role_advantages(records, rewards, per_call_roles=per_call, eps=cfg.algo.adv_eps)
    return rewards, advs


def fill_advantages(batches: Sequence[PackedBatch], refs: Sequence[CallRef],
                    advantages: Sequence[Dict[str, float]]) -> None:
    """Write each call's advantage on its trained positions (OPD calls, with none, keep 0)."""
    per_batch: Dict[int, Dict[int, float]] = {}
    for r in refs:
        a = advantages[r.record].get(r.call.call_id)
        if a is not None:
            per_batch.setdefault(r.batch, {})[r.seq] = a
    for b, batch in enumerate(batches):
        table = per_batch.get(b, {})
        n_seq = int(batch.seq_ids.max()) + 1
        seq_adv = torch.zeros(n_seq, dtype=torch.float32)
        for s, a in table.items():
            seq_adv[s] = a
        batch.advantages = torch.where(batch.roles >= 0, seq_adv[batch.seq_ids.cpu()].to(batch.roles.device),
                                       torch.zeros((), device=batch.roles.device))
