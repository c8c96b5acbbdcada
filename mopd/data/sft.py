"""Supervised fine-tuning on agent-call sequences: next-token cross-entropy on model-written tokens.

A sequence is one agent call as the workflows record it: token ids and a loss mask (1 on tokens
the model wrote). Layout and memory plan:

- Calls of the same role start with the same system prompt (about 130 tokens of the 233 of the
  warm start's average call). Sequences are grouped by role, and each micro-batch runs its common
  prefix once; gradients flow from every call into the prefix, so loss and gradients equal those
  of the unshared forward (tested).
- Packed (the default, ``SFTSettings.packed``): a micro-batch is one row, the prefix then the rest
  of each call, every token at its own call's position, no padding; the attention
  (:func:`packed_attention`) lets each call's tokens see the prefix and their own call. On the warm
  start's batches this is 0.68x the positions the padded layout computes (5,473 against 8,124 a step).
- Padded: right-padded rows of one role (no attention mask: with causal attention a real token
  never sees the pads after it), the prefix's KV cache repeated for every row.
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


PACKED = "mopd_sft_packed"
"""The attention implementation a packed SFT forward runs under (:func:`packed_attention`)."""
LAYOUT_KWARG = "sft_packed_layout"


def packed_micro_batches(seqs: Sequence[Seq], budget: int, key_len: int = 16) -> List[List[int]]:
    """Indices of ``seqs`` grouped by role prompt (their first ``key_len`` ids), in order, each
    group cut so that a packed row (the group's shared prefix once, then every sequence's rest)
    holds at most ``budget`` tokens (a sequence longer than that alone)."""
    groups: Dict[tuple, List[int]] = {}
    for i, (ids, _) in enumerate(seqs):
        groups.setdefault(tuple(ids[:key_len]), []).append(i)
    out: List[List[int]] = []
    for members in groups.values():
        prefix = shared_prefix_len([seqs[i] for i in members]) if len(members) > 1 else 0
        size = budget + 1
        for i in members:
            rest = len(seqs[i][0]) - prefix
            if size + rest > budget:
                out.append([])
                size = prefix
            out[-1].append(i)
            size += rest
    return out


def packed_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """A transformers attention function for one packed row [1, H, P + sum(n_s), D]: the shared
    prefix (P tokens) causal over itself, and each sequence's rest (n_s tokens) over the prefix
    and, causally, itself, as the unpacked sequence would (one SDPA per sequence, its keys the
    prefix's and its own). A call without a layout (generation) is transformers' SDPA.

    Measured against two other layouts in one process on the demo's batches (1 thread): the rests
    right-padded into one batch behind copies of the prefix, one causal SDPA (1.3x this one's
    time), and one mask-free causal SDPA per sequence over its prefix and rest (1.3x: the prefix's
    rows computed again for every sequence)."""
    import torch
    import torch.nn.functional as F
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    layout = kwargs.pop(LAYOUT_KWARG, None)
    if layout is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    prefix, lengths = layout
    q, k, v = query[0], key[0], value[0]   # [H, L, D]
    gqa = q.shape[0] != k.shape[0]
    outs = []
    if prefix:
        outs.append(F.scaled_dot_product_attention(q[:, :prefix], k[:, :prefix], v[:, :prefix], is_causal=True,
                                                   scale=scaling, enable_gqa=gqa))
    start = prefix
    for n in lengths:
        end = start + n
        if prefix:
            keys, values = torch.cat([k[:, :prefix], k[:, start:end]], 1), torch.cat([v[:, :prefix], v[:, start:end]], 1)
            mask = torch.ones(n, prefix + n, dtype=torch.bool).tril(prefix)   # the prefix, and itself so far
            outs.append(F.scaled_dot_product_attention(q[:, start:end], keys, values, attn_mask=mask, scale=scaling,
                                                       enable_gqa=gqa))
        else:
            outs.append(F.scaled_dot_product_attention(q[:, start:end], k[:, start:end], v[:, start:end],
                                                       is_causal=True, scale=scaling, enable_gqa=gqa))
        start = end
    return torch.cat(outs, 1).transpose(0, 1)[None], None


def _register_packed() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(PACKED, packed_attention)
    AttentionMaskInterface.register(PACKED, sdpa_mask)


def sft_loss_sum_packed(model, seqs: Sequence[Seq], token_weights=None):
    """:func:`sft_loss_sum` over ``seqs`` packed into one row without padding: their common prefix
    (the role's system prompt) once, then the rest of each, every position at its own sequence's
    position (rotary embeddings as unpacked); attention by :func:`packed_attention` (the model
    must run under :data:`PACKED`). Equal to the unpacked loss and gradients (tested)."""
    import torch
    import torch.nn.functional as F

    P = shared_prefix_len(seqs) if len(seqs) > 1 else 0
    row, positions, predict, targets = list(seqs[0][0][:P]), list(range(P)), [], []
    for ids, m in seqs:
        at = len(row) - P   # where this sequence's token P sits, less P
        predict += [at + j for j in range(P, len(ids) - 1) if m[j + 1]]
        targets += [ids[j + 1] for j in range(P, len(ids) - 1) if m[j + 1]]
        row += ids[P:]
        positions += range(P, len(ids))
    layout = (P, [len(ids) - P for ids, _ in seqs])
    hidden = model.model(input_ids=torch.tensor([row]), position_ids=torch.tensor([positions]), use_cache=False,
                         attention_mask=_NO_MASK(), **{LAYOUT_KWARG: layout}).last_hidden_state[0]
    logits = model.lm_head(hidden[torch.tensor(predict, dtype=torch.long)]).float()
    targets = torch.tensor(targets, dtype=torch.long)
    if token_weights is None:
        return F.cross_entropy(logits, targets, reduction="sum"), float(len(predict))
    w = token_weights[targets]
    return (F.cross_entropy(logits, targets, reduction="none") * w).sum(), float(w.sum())


def _NO_MASK():
    """What a packed forward passes as ``attention_mask``: transformers hands a 4-D mask through
    untouched, so no [L, L] mask is built for a row whose boundaries travel in the layout."""
    import torch

    return torch.ones(1, 1, 1, 1, dtype=torch.bool)


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
    """Tokens per forward/backward: a packed row's real tokens, or a padded batch's with ``packed`` off
    (memory only: the step is the same either way)."""
    log_every: int = 10
    """Steps between progress lines."""
    packed: bool = True
    """Pack each role's sequences into one row (its prefix once, no padding: ``micro_batch_tokens``
    then bounds the row's real tokens) instead of right-padded rows: the same loss and gradients
    in about 0.88x the time on the warm start's batches (bench/RESULTS.md, "pi_0's SFT without
    padding")."""


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
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay,
                            fused=all(p.device.type in ("cpu", "cuda") for p in model.parameters()))
    warmup = max(1, int(warmup_frac * steps))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / warmup, 0.5 * (1 + math.cos(
        math.pi * min(1.0, max(0, s + 1 - warmup) / max(1, steps - warmup))))))
    order: List[int] = []
    losses: List[float] = []
    model.train()
    attn = model.config._attn_implementation
    if s.packed:   # left set if the loop is interrupted: without a packed layout it is SDPA
        _register_packed()
        model.set_attn_implementation(PACKED)
    t0 = time.perf_counter()
    for step in range(steps):
        batch: List[int] = []
        while len(batch) < episodes_per_step:
            if not order:
                order = list(range(len(episodes)))
                rng.shuffle(order)
            batch.append(order.pop())
        seqs = [q for e in batch for q in episodes[e]]
        if token_weights is None:
            n_tokens = float(sum(sum(m[1:]) for _, m in seqs))
        else:   # one gather for the step's targets, summed in float64 as the per-token sum was
            targets = [t for ids, m in seqs for t, k in zip(ids[1:], m[1:], strict=True) if k]
            n_tokens = float(token_weights[torch.tensor(targets, dtype=torch.long)].sum(dtype=torch.float64))
        total = 0.0
        for mb in (packed_micro_batches if s.packed else micro_batches)(seqs, micro_batch_tokens):
            part = [seqs[i] for i in mb]
            loss, _ = (sft_loss_sum_packed(model, part, token_weights) if s.packed
                       else sft_loss_sum(model, part, pad_id, token_weights=token_weights))
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
    model.set_attn_implementation(attn)
    model.eval()
    return losses
