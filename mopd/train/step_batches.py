"""A step's records as packed micro-batches, and per-call values read back from them.

This is the glue between the records (one agent call = one sequence) and the packed tensors the
model and the loss see: :func:`pack_records` lays every call into micro-batches of at most
``budget`` tokens, remembering where each call went (:class:`CallRef`); after scoring,
:meth:`StepBatches.per_call_sums` sums a per-token value over each call's trained tokens (the KL in
reward), and :meth:`StepBatches.fill_advantages` writes each call's advantage onto its trained
positions. The method itself (rewards, grouping, advantages) is ``mopd.algo``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Sequence, Tuple

import torch

from mopd.algo.advantages import call_token_signals
from mopd.core.records import AgentCall, WorkflowRecord
from mopd.train.balance import deal_into, micro_batch_count
from mopd.train.packing import PackedBatch, build_packed_batch

CallKey = Tuple[int, str]
"""(record index, call id)."""


@dataclass
class CallRef:
    """Where a call lives: its record, and its place in the packed micro-batches."""

    record: int
    call: AgentCall
    batch: int = -1
    seq: int = -1


@dataclass
class StepBatches:
    """The packed micro-batches of one step and where each call sits in them."""

    refs: List[CallRef]
    batches: List[PackedBatch]

    def per_call_sums(self, values: Sequence[torch.Tensor]) -> Dict[CallKey, float]:
        """Sum of ``values[b]`` over each call's trained positions: {(record, call_id): sum}."""
        out: Dict[CallKey, float] = {}
        for b, members in self._by_batch().items():
            batch, v = self.batches[b], values[b]
            trained = (batch.roles >= 0).to(v.dtype)
            sums = torch.zeros(_num_seqs(batch), dtype=torch.float64).index_add_(
                0, batch.seq_ids.cpu(), (v * trained).double().cpu())
            for r in members:
                out[(r.record, r.call.call_id)] = float(sums[r.seq])
        return out

    def fill_advantages(self, advantages: Sequence[Dict[str, float]]) -> None:
        """Write each call's advantage on its trained positions, those ``call_token_signals`` gave its
        role (OPD calls, with none, keep 0: the loss forms their advantage from the teacher)."""
        by_batch = self._by_batch()
        for b, batch in enumerate(self.batches):
            seq_adv = torch.zeros(_num_seqs(batch), dtype=torch.float32)
            for r in by_batch.get(b, []):
                a = advantages[r.record].get(r.call.call_id)
                if a is not None:
                    seq_adv[r.seq] = a
            batch.advantages = torch.where(batch.roles >= 0, seq_adv[batch.seq_ids.cpu()].to(batch.roles.device),
                                           torch.zeros((), device=batch.roles.device))

    def _by_batch(self) -> Dict[int, List[CallRef]]:
        out: Dict[int, List[CallRef]] = {}
        for r in self.refs:
            out.setdefault(r.batch, []).append(r)
        return out


def _num_seqs(batch: PackedBatch) -> int:
    return int(batch.seq_ids.max()) + 1


def pack_records(records: Sequence[WorkflowRecord], budget: int, *, device: torch.device, pad_id: int = 0,
                 agree_count: Callable[[int], int] = lambda n: n) -> StepBatches:
    """Every call with something to predict, packed into micro-batches of at most ``budget`` tokens
    (roles and sampling log-probs per token, advantages 0 until filled).

    ``agree_count(n)`` returns the number of micro-batches every rank must run (the maximum over
    ranks under FSDP); each rank deals its calls into exactly that many, token-balanced
    (``mopd.train.balance``), so a micro-batch is empty (one pad token, role -1) only where a rank
    has fewer calls than micro-batches.
    """
    refs = [CallRef(i, c) for i, rec in enumerate(records) for c in rec.calls if len(c) > 1]
    lengths = [len(r.call) for r in refs]
    count = agree_count(micro_batch_count(lengths, budget))
    plan = deal_into(lengths, budget, count) if count else []
    pad = 8 if device.type == "cuda" else 1
    batches: List[PackedBatch] = []
    for b, members in enumerate(plan):
        toks, roles, advs, lps = [], [], [], []
        for s, idx in enumerate(members):
            r = refs[idx]
            r.batch, r.seq = b, s
            # advantages are not known before scoring (the KL in reward needs it): 0 until filled
            rl, av = call_token_signals(r.call, None)
            toks.append(r.call.token_ids())
            roles.append(rl)
            advs.append(av)
            lps.append(r.call.sampling_logprobs())
        batches.append(build_packed_batch(toks, roles, advs, lps, items=members, pad_to_multiple=pad,
                                          pad_id=pad_id).to(device))
    return StepBatches(refs, batches)
