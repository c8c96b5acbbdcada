"""Packing agent calls into micro-batches by a token budget.

Every agent call is one sequence. A micro-batch is ONE row of concatenated sequences (no padding
between them): each sequence attends only to itself (block-diagonal causal mask, or flash-attn
varlen with ``cu_seqlens``) and its position ids restart at 0. Per-token training signals are
shifted by one, because the hidden state at position i predicts token i+1 of the same sequence;
the last position of every sequence predicts nothing (role -1).

Bins are filled first-fit-decreasing. Every rank must then run the same number of micro-batches
(FSDP's collectives), each rank spreading its own calls over them by tokens: ``mopd.train.balance``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch
from mopd_kernels import LossInputs


def pack_sequences(lengths: Sequence[int], budget: int) -> List[List[int]]:
    """Group sequence indices into micro-batches of at most ``budget`` tokens, first-fit
    decreasing (bins end up nearly full: few micro-batches). A sequence longer than the budget
    gets a micro-batch of its own. How many micro-batches each rank runs, and how a rank's calls
    are spread over them, is ``mopd.train.balance``'s."""
    if budget <= 0:
        raise ValueError("budget must be positive")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    bins: List[List[int]] = []
    loads: List[int] = []
    for i in order:
        n = lengths[i]
        for b, load in enumerate(loads):
            if load + n <= budget:
                bins[b].append(i)
                loads[b] += n
                break
        else:
            bins.append([i])
            loads.append(n)
    return bins


def split_balanced(items: Sequence[int], lengths: Sequence[int]) -> Tuple[List[int], List[int]]:
    """``items`` in two halves of similar token loads (longest first, onto the lighter half)."""
    a, b, la, lb = [], [], 0, 0
    for i in sorted(items, key=lambda k: -lengths[k]):
        if la <= lb:
            a.append(i)
            la += lengths[i]
        else:
            b.append(i)
            lb += lengths[i]
    return a, b


@dataclass
class PackedBatch:
    """One micro-batch: a single row of concatenated sequences and their per-position signals.

    Position i holds the signals of the token it *predicts* (token i+1 of its sequence).
    """

    input_ids: torch.Tensor      # [L] long
    position_ids: torch.Tensor   # [L] long, restarting at 0 per sequence
    seq_ids: torch.Tensor        # [L] long, index of the sequence within the micro-batch
    cu_seqlens: torch.Tensor     # [S+1] int32, sequence boundaries (flash-attn varlen)
    targets: torch.Tensor        # [L] long, next token (0 where nothing is predicted)
    roles: torch.Tensor          # [L] long, role id of the predicted token, -1 if not trained
    advantages: torch.Tensor     # [L] float, outcome advantage of the predicted token
    sampling_logp: torch.Tensor  # [L] float, log-prob the engine recorded for the predicted token
    items: List[int]             # indices of the packed sequences in the caller's list
    pad_tokens: int = 0
    old_logp: Optional[torch.Tensor] = None      # [L] fp32 log pi_old, once scored
    teacher_logp: Optional[torch.Tensor] = None  # [L] fp32 log pi_T (OPD), once scored
    ref_logp: Optional[torch.Tensor] = None      # [L] fp32 log pi_ref (KL), once scored

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    @property
    def loss_tokens(self) -> int:
        return int((self.roles >= 0).sum())

    def loss_inputs(self):
        """The per-token inputs of the fused loss (``mopd_kernels.LossInputs``), once scored."""
        if self.old_logp is None:
            raise ValueError("the micro-batch has no old_logp yet: score it before computing the loss")
        return LossInputs(roles=self.roles, old_logp=self.old_logp, advantages=self.advantages,
                          teacher_logp=self.teacher_logp, ref_logp=self.ref_logp)

    def to(self, device) -> "PackedBatch":
        kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        return PackedBatch(**kw)


def build_packed_batch(tokens: Sequence[Sequence[int]], roles: Sequence[Sequence[int]],
                       advantages: Sequence[Sequence[float]], sampling_logp: Sequence[Sequence[float]],
                       items: Optional[List[int]] = None, pad_to_multiple: int = 1,
                       pad_id: int = 0) -> PackedBatch:
    """Concatenate sequences (per-token signals aligned with their tokens) into a PackedBatch.

    An empty micro-batch (a rank with nothing to do) becomes a single pad token with role -1, so
    every rank still runs the forward/backward its collectives expect.
    """
    ids, pos, sid, tgt, rol, adv, slp, cu = [], [], [], [], [], [], [], [0]
    for s, (t, r, a, lp) in enumerate(zip(tokens, roles, advantages, sampling_logp, strict=True)):
        n = len(t)
        if not (len(r) == len(a) == len(lp) == n):
            raise ValueError(f"sequence {s}: {n} tokens but {len(r)} roles, {len(a)} advantages, {len(lp)} logprobs")
        if n == 0:
            continue
        ids.extend(t)
        pos.extend(range(n))
        sid.extend([s] * n)
        tgt.extend(list(t[1:]) + [0])
        rol.extend(list(r[1:]) + [-1])
        adv.extend(list(a[1:]) + [0.0])
        slp.extend(list(lp[1:]) + [0.0])
        cu.append(cu[-1] + n)
    pad = (-len(ids)) % pad_to_multiple if ids else 1
    if pad:
        last = (sid[-1] + 1) if sid else 0
        ids.extend([pad_id] * pad)
        pos.extend(range(pad))
        sid.extend([last] * pad)
        tgt.extend([0] * pad)
        rol.extend([-1] * pad)
        adv.extend([0.0] * pad)
        slp.extend([0.0] * pad)
        cu.append(cu[-1] + pad)
    return PackedBatch(
        input_ids=torch.tensor(ids, dtype=torch.long), position_ids=torch.tensor(pos, dtype=torch.long),
        seq_ids=torch.tensor(sid, dtype=torch.long), cu_seqlens=torch.tensor(cu, dtype=torch.int32),
        targets=torch.tensor(tgt, dtype=torch.long), roles=torch.tensor(rol, dtype=torch.long),
        advantages=torch.tensor(adv, dtype=torch.float32), sampling_logp=torch.tensor(slp, dtype=torch.float32),
        items=list(items) if items is not None else list(range(len(tokens))), pad_tokens=pad)


def padding_fraction(batches: Sequence[PackedBatch]) -> float:
    total = sum(b.num_tokens for b in batches)
    return sum(b.pad_tokens for b in batches) / total if total else 0.0
