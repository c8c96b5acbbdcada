"""Score only the sequences that need a frozen model's log-probs.

The teacher's log-probs enter only OPD tokens and the reference's only KL tokens (docs/method.md).
In Stage II without a KL term only Searcher calls need the teacher, yet a micro-batch packs calls
of every role. ``score_needed`` runs the frozen model on the sub-batch of sequences that hold at
least one token of the given roles and scatters the result back into a full-length tensor
(zeros elsewhere, where the loss never reads it).

Under FSDP2 every rank must run the same forwards (each is a chain of all-gathers), so a sharded
scorer with nothing to score still runs one on a single token (``collective=True``); a replicated
scorer skips the forward entirely.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

from mopd.train.packing import PackedBatch


def sequences_with_roles(batch: PackedBatch, role_ids: Sequence[int]) -> torch.Tensor:
    """Sorted indices (within the micro-batch) of the sequences holding a token of ``role_ids``."""
    wanted = torch.isin(batch.roles, torch.as_tensor(list(role_ids), device=batch.roles.device))
    return torch.unique(batch.seq_ids[wanted])


def select_sequences(batch: PackedBatch, keep: torch.Tensor) -> tuple[PackedBatch, torch.Tensor]:
    """The micro-batch restricted to the sequences ``keep`` (their order kept), and the positions
    of its tokens in the original row. Every per-token field is sliced; boundaries are rebuilt."""
    mask = torch.isin(batch.seq_ids, keep)
    positions = mask.nonzero().squeeze(-1)
    lengths = torch.bincount(torch.searchsorted(keep, batch.seq_ids[positions]), minlength=len(keep))
    cu = torch.zeros(len(keep) + 1, dtype=torch.int32, device=batch.cu_seqlens.device)
    cu[1:] = torch.cumsum(lengths, 0).to(device=cu.device, dtype=torch.int32)
    n = batch.num_tokens
    fields = {}
    for f in dataclasses.fields(batch):
        v = getattr(batch, f.name)
        if isinstance(v, torch.Tensor) and v.dim() == 1 and v.shape[0] == n and f.name != "cu_seqlens":
            fields[f.name] = v[positions]
        else:
            fields[f.name] = v
    fields["cu_seqlens"] = cu
    fields["seq_ids"] = torch.searchsorted(keep, batch.seq_ids[positions])
    items = list(batch.items)
    fields["items"] = [items[int(s)] for s in keep.tolist() if int(s) < len(items)]
    fields["pad_tokens"] = 0
    return dataclasses.replace(batch, **fields), positions


def score_needed(score: Callable[[PackedBatch], torch.Tensor], batch: PackedBatch, role_ids: Sequence[int],
                 *, collective: bool = False) -> torch.Tensor:
    """``score(batch)`` where it matters: fp32 [L], the scorer's values at the tokens of the
    sequences holding ``role_ids``, zeros elsewhere."""
    keep = sequences_with_roles(batch, role_ids)
    n_seqs = int(batch.seq_ids.max()) + 1 if batch.num_tokens else 0
    if len(keep) == n_seqs:
        return score(batch).float()
    out = torch.zeros(batch.num_tokens, dtype=torch.float32, device=batch.input_ids.device)
    if len(keep) == 0:
        if collective:                                   # keep the ranks' collectives in step
            first = torch.zeros(1, dtype=batch.seq_ids.dtype, device=batch.seq_ids.device)
            sub, _ = select_sequences(batch, first)
            score(dataclasses.replace(sub, **_first_token(sub)))
        return out
    sub, positions = select_sequences(batch, keep)
    out[positions] = score(sub).float()
    return out


def _first_token(sub: PackedBatch) -> dict:
    n = sub.num_tokens
    fields = {f.name: getattr(sub, f.name)[:1] for f in dataclasses.fields(sub)
              if isinstance(getattr(sub, f.name), torch.Tensor) and getattr(sub, f.name).dim() == 1
              and getattr(sub, f.name).shape[0] == n and f.name != "cu_seqlens"}
    fields["cu_seqlens"] = torch.tensor([0, 1], dtype=torch.int32, device=sub.cu_seqlens.device)
    return fields
