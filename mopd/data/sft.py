"""Supervised fine-tuning on agent-call sequences: next-token cross-entropy on model-written tokens.

A sequence is one agent call as the workflows record it: token ids and a loss mask (1 on tokens
the model wrote). Padding and memory plan:

- Right padding needs no attention mask: with causal attention a real token never sees the pads
  after it, and SDPA then takes its fast causal path.
- Calls of the same role start with the same system prompt (about 110 tokens of the 200-600 of a
  call). Sequences are grouped by role, and each micro-batch runs its common prefix once and
  repeats the prefix's KV cache for every row; gradients flow through the cache into the prefix,
  so loss and gradients equal those of the unshared forward (tested).
- Logits are computed only at the positions that predict a loss token (about a tenth of all).
"""

from __future__ import annotations

import math
import random
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

Seq = Tuple[List[int], List[int]]


def shared_prefix_len(seqs: Sequence[Seq]) -> int:
    """The longest common prefix of ``seqs``, cut before the position that predicts the first
    loss token of any of them (so no loss position lies in the prefix)."""
    first = min(len(ids) for ids, _ in seqs)
    for _, m in seqs:
        first = min(first, next((i for i, v in enumerate(m) if v), len(m)))
    n, ref = 0, seqs[0][0]
    while n < first - 1 and all(ids[n] == ref[n] for ids, _ in seqs):
        n += 1
    return n


def micro_batches(seqs: Sequence[Seq], budget: int, key_len: int = 16) -> List[List[int]]:
    """Indices of ``seqs`` grouped by role prompt (their first ``key_len`` ids: the system
    message), then by length, longest first, so that rows x longest <= ``budget``."""
    groups: Dict[tuple, List[int]] = {}
    for i, (ids, _) in enumerate(seqs):
        groups.setdefault(tuple(ids[:key_len]), []).append(i)
    out: List[List[int]] = []
    for members in groups.values():
        start = len(out)
        for i in sorted(members, key=lambda i: -len(seqs[i][0])):
            if len(out) > start and (len(out[-1]) + 1) * len(seqs[out[-1][0]][0]) <= budget:
                out[-1].append(i)
            else:
                out.append([i])
    return out


def sft_loss_sum(model, seqs: Sequence[Seq], pad_id: int, share_prefix: bool = True, token_weights=None):
    """Summed next-token cross-entropy over the loss-mask tokens of ``seqs`` (right-padded, no
    attention mask needed under causal attention), and the number of those tokens; with
    ``token_weights`` (a [vocab] tensor), each token's term and count weighted by its target's weight.

    ``share_prefix``: their common prefix (the role's system prompt) is run once and its KV cache
    repeated for every row, instead of once per row; gradients flow through the cache into the
    prefix, so loss and gradients equal those of the unshared forward."""
    import inspect

    import torch
    import torch.nn.functional as F

    P = shared_prefix_len(seqs) if share_prefix and len(seqs) > 1 else 0
    width = max(len(ids) for ids, _ in seqs) - P
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for r, (t, m) in enumerate(seqs):
        ids[r, :len(t) - P] = torch.tensor(t[P:])
        mask[r, :len(m) - P] = torch.tensor(m[P:], dtype=torch.bool)
    kwargs = dict(input_ids=ids, use_cache=False)
    if P:
        cache_arg = "cache" if "cache" in inspect.signature(model.model.forward).parameters else "past_key_values"
        prefix = model.model(input_ids=torch.tensor([seqs[0][0][:P]]), use_cache=True)
        cache = getattr(prefix, "past_key_values", None) or prefix.cache
        cache.batch_repeat_interleave(len(seqs))
        kwargs.update({cache_arg: cache, "use_cache": True,
                       "position_ids": torch.arange(P, P + width)[None].expand(len(seqs), -1)})
    predict = mask[:, 1:]  # position i predicts token i+1
    hidden = model.model(**kwargs).last_hidden_state[:, :-1][predict]
    logits = model.lm_head(hidden).float()
    targets = ids[:, 1:][predict]
    if token_weights is None:
        return F.cross_entropy(logits, targets, reduction="sum"), float(predict.sum())
    w = token_weights[targets]
    return (F.cross_entropy(logits, targets, reduction="none") * w).sum(), float(w.sum())


@dataclass(frozen=True)
class SFTSettings:
    """Optimisation of a supervised fine-tuning run."""

    steps: int
    """Optimiser steps."""
    episodes_per_step: int
    """Episodes (all their sequences) per step, drawn without replacement, reshuffled each epoch."""
    lr: float
    """AdamW peak learning rate (linear warm-up, then cosine decay to 0)."""
    seed: int = 0
    """Seed of the episode order."""
    warmup_frac: float = 0.05
    """Fraction of the steps spent warming up."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Global gradient-norm clip."""
    micro_batch_tokens: int = 4096
    """Padded tokens per forward/backward (memory only: the step is the same either way)."""
    log_every: int = 10
    """Steps between progress lines."""


def train_sft(model, episodes: Sequence[Sequence[Seq]], settings: SFTSettings, *, pad_id: int,
              token_weights=None, progress: bool = False) -> List[float]:
    """Supervised fine-tuning on ``episodes`` (each a list of sequences, trained together),
    ``settings.episodes_per_step`` drawn per step without replacement (reshuffled each epoch);
    AdamW with linear warm-up and cosine decay, gradient clipping, token-mean loss per step.
    ``token_weights[v]`` weighs target token ``v`` in the loss. Returns the mean loss of every step."""
    s = settings
    steps, episodes_per_step, lr, seed = s.steps, s.episodes_per_step, s.lr, s.seed
    warmup_frac, weight_decay, grad_clip = s.warmup_frac, s.weight_decay, s.grad_clip
    micro_batch_tokens, log_every = s.micro_batch_tokens, s.log_every
    import torch

    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)
    warmup = max(1, int(warmup_frac * steps))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / warmup, 0.5 * (1 + math.cos(
        math.pi * min(1.0, max(0, s + 1 - warmup) / max(1, steps - warmup))))))
    order: List[int] = []
    losses: List[float] = []
    model.train()
    t0 = time.perf_counter()
    for step in range(steps):
        batch: List[int] = []
        while len(batch) < episodes_per_step:
            if not order:
                order = list(range(len(episodes)))
                rng.shuffle(order)
            batch.append(order.pop())
        seqs = [s for e in batch for s in episodes[e]]
        if token_weights is None:
            n_tokens = float(sum(sum(m[1:]) for _, m in seqs))
        else:
            n_tokens = float(sum(float(token_weights[t]) for ids, m in seqs for t, k in zip(ids[1:], m[1:], strict=True) if k))
        total = 0.0
        for mb in micro_batches(seqs, micro_batch_tokens):
            loss, _ = sft_loss_sum(model, [seqs[i] for i in mb], pad_id, token_weights=token_weights)
            (loss / n_tokens).backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total / max(1, n_tokens))
        if progress and (step % log_every == 0 or step == steps - 1):
            print(f"sft step {step + 1}/{steps}  loss {losses[-1]:.3f}  {time.perf_counter() - t0:.0f}s",
                  file=sys.stderr, flush=True)
    model.eval()
    return losses
