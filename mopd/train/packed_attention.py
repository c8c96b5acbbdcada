"""Attention over a packed micro-batch without padding: each agent call attends only to itself.

A micro-batch is one row of L tokens, the concatenation of S calls (``PackedBatch``). The
attention it needs is block-diagonal causal: token i of call s sees tokens 0..i of call s. Three
implementations compute exactly that, registered with transformers' ``AttentionInterface``
under our names, so the rest of the model (projections, norms, MLP: most of the FLOPs at these
lengths) runs over the L real tokens only, never over padding:

- ``VARLEN``: ``torch.nn.attention.varlen.varlen_attn`` (FlashAttention-2 kernels shipped inside
  torch; CUDA, fp16/bf16). Work sum_s n_s^2 / 2 per head, memory O(L): the output [L, Hq, D]
  and the fp32 log-sum-exp [Hq, L] saved for backward; no [L, L] anything. GQA natively where
  the installed torch has ``enable_gqa`` (2.13), else K/V repeated to Hq heads (a transient
  [L, Hq, D] pair per layer).
- ``FLEX``: FlexAttention with a document mask (same call and causal) over the [1, L] row,
  compiled once (dynamic shapes: one compile for every L). The BlockMask is 128x128-block
  granular: blocks straddling two calls are computed and masked, so work is about
  sum_s n_s^2 / 2 plus a block of slack per boundary. CPU and CUDA; on CPU FlexAttention has no
  backward, so under autograd on CPU the same attention is computed as ``SEGMENTS`` does.
- ``SEGMENTS`` (config ``packed_sdpa``): the projections, norms and MLP on the packed row, and
  for the attention alone (``packed_causal_attention``) either the calls scattered into a
  right-padded [S, H, W, D] batch (W the longest call) for one causal SDPA, then gathered back
  (work S * W^2 / 2 per head, one batched kernel call), or, on a CPU running one thread, one
  causal SDPA per call over views of the packed row (work sum_s n_s^2 / 2, no copies; 0.34-0.55x
  the padded path's time there). Pure torch, any device, differentiable.

``segment_attention`` (one SDPA per call, pure torch) is the reference the tests hold the
others to, and ``reference_varlen_attn`` wraps it in varlen_attn's signature for CPU tests.

The sequence boundaries (``PackedLayout``) are computed ONCE per micro-batch in
``packed_layout`` (host lengths, device cu_seqlens, the block mask) and handed to every layer
through the model's keyword arguments: no layer re-derives them or syncs with the host.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

VARLEN = "mopd_varlen"
FLEX = "mopd_flex"
SEGMENTS = "mopd_segments"
NAMES = (VARLEN, FLEX, SEGMENTS)
LAYOUT_KWARG = "packed_layout"
FLEX_BLOCK = 128


@dataclass(frozen=True)
class PackedLayout:
    """Where each call of a packed row starts and ends, in the forms the kernels take."""

    lengths: Tuple[int, ...]          # host ints, one per call
    cu_seqlens: torch.Tensor          # [S+1] int32 on the row's device (VARLEN)
    max_len: int                      # the longest call (VARLEN's grid, SEGMENTS' width)
    rows: torch.Tensor                # [L] long: the call of each token (SEGMENTS)
    cols: torch.Tensor                # [L] long: its position in the call (SEGMENTS)
    block_mask: Optional[object] = None   # FlexAttention BlockMask (FLEX)


def packed_layout(cu_seqlens: torch.Tensor, device: torch.device, with_block_mask: bool = False) -> PackedLayout:
    """The layout of a row whose calls end at ``cu_seqlens`` ([S+1], host or device)."""
    cu_host = cu_seqlens.detach().to("cpu", torch.int64)
    lengths = tuple((cu_host[1:] - cu_host[:-1]).tolist())
    mask = document_block_mask(lengths, device) if with_block_mask else None
    counts = torch.tensor(lengths, device=device)
    rows = torch.repeat_interleave(torch.arange(len(lengths), device=device), counts)
    cols = torch.arange(int(cu_host[-1]), device=device) - torch.repeat_interleave(cu_host[:-1].to(device), counts)
    return PackedLayout(lengths=lengths, cu_seqlens=cu_host.to(device=device, dtype=torch.int32),
                        max_len=max(lengths), rows=rows, cols=cols, block_mask=mask)


def flex_length(total: int) -> int:
    """The row length FlexAttention runs at: over one block, never a whole number of blocks.

    torch 2.13's CPU inductor specialises flex_attention's first compile to a row of one block
    or less, or of a whole number of blocks, and its recompile for a later row can fail in C++
    (``cur_qSplitSize8`` undeclared). Rows are extended to avoid those lengths: up to 129 tokens
    for short rows, one token for a whole number of blocks; attention only, never the MLP."""
    n = max(total, FLEX_BLOCK + 1)
    return n + 1 if n % FLEX_BLOCK == 0 else n


def document_block_mask(lengths, device: torch.device):
    """FlexAttention BlockMask of the block-diagonal causal mask over calls of ``lengths``, at
    ``flex_length``: the tail past the calls is one more document that no call sees.

    The block-count dimensions are marked dynamic, so the first compile already serves every
    row length (left static, a row with another number of blocks recompiles, and torch 2.13's
    CPU recompile can fail as above)."""
    total = int(sum(lengths))
    padded = flex_length(total)
    seq = torch.repeat_interleave(torch.arange(len(lengths) + 1, device=device),
                                  torch.tensor([*lengths, padded - total], device=device))

    def same_call_causal(b, h, q, kv):
        return (seq[q] == seq[kv]) & (q >= kv)

    mask = create_block_mask(same_call_causal, None, None, padded, padded, device=device, BLOCK_SIZE=FLEX_BLOCK)
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                 "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices"):
        t = getattr(mask, name, None)
        for dim in range(2, t.dim() if t is not None else 0):
            torch._dynamo.mark_dynamic(t, dim)
    return mask


# --- the maths, in the packed [L, heads, D] layout of varlen_attn -------------------------------

def segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths, scale: Optional[float]) -> torch.Tensor:
    """Block-diagonal causal attention of q [L, Hq, D], k/v [L, Hkv, D]: one causal SDPA per call.

    Call s's rows are softmax(q_s k_s^T * scale + causal) v_s; K/V head j serves query heads
    j*g .. j*g+g-1 (g = Hq / Hkv), as in transformers' ``repeat_kv`` and FlashAttention.

    The calls are ``split`` views of the packed tensors (backward: one ``cat`` of their
    gradients, where a slice each would fill a zero tensor of the whole row per call), given to
    SDPA as 4-D [1, H, n, D] (3-D input sends CPU SDPA to its math kernel: bmm, softmax, a [H, n,
    n] matrix, 2-3x the time of its flash kernel, and what made this path look 4x slower than the
    padded batch on 2026-12-03).
    """
    gqa = q.shape[1] != k.shape[1]
    lengths = list(lengths)
    outs = [F.scaled_dot_product_attention(qs.transpose(0, 1)[None], ks.transpose(0, 1)[None],
                                           vs.transpose(0, 1)[None], is_causal=True, scale=scale,
                                           enable_gqa=gqa)[0].transpose(0, 1)
            for qs, ks, vs in zip(q.split(lengths), k.split(lengths), v.split(lengths))]
    return torch.cat(outs, 0)


def padded_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: "PackedLayout",
                            scale: Optional[float]) -> torch.Tensor:
    """The same attention as ``segment_attention``, by one causal SDPA over the calls laid out
    as a right-padded [S, H, W, D] batch (W the longest call), for the attention alone.

    Right padding needs no mask: with the causal mask, token i of a call sees positions 0..i of
    its row, all of them its own call's; the padding rows compute something and are dropped.
    Work S * W^2 / 2 per head (the padded batch's attention) but one batched kernel call,
    which on CPU is 4x faster than S calls (forward and backward, 8k-token rows); memory: q, k,
    v and the output padded, [S, W, H, D] each, per layer (saved for backward)."""
    n_calls, width = len(layout.lengths), layout.max_len

    def pad(t):
        out = t.new_zeros(n_calls, width, t.shape[1], t.shape[2])
        out[layout.rows, layout.cols] = t
        return out.transpose(1, 2)

    o = F.scaled_dot_product_attention(pad(q), pad(k), pad(v), is_causal=True, scale=scale,
                                       enable_gqa=q.shape[1] != k.shape[1])
    return o.transpose(1, 2)[layout.rows, layout.cols]


def packed_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: "PackedLayout",
                            scale: Optional[float]) -> torch.Tensor:
    """SEGMENTS' attention: one SDPA per call over views of the packed tensors on a CPU running
    one thread (or for a row of one call), else the padded batch (``padded_causal_attention``).

    Measured in one process (bench/bench_packed_attention_copy.py, forward + backward, rows of
    60-1,500-token calls): on one thread the calls alone take 0.34-0.55x the padded round trip's
    CPU time (2k and 8k-token rows, SmolLM2's 9/3 heads of 64 and the tiny model's 4 of 32): no
    copies, no zero fills, and sum_s n_s^2 / 2 work instead of S * W^2 / 2. On two threads of a
    loaded machine they took 0.94-2.0x its wall time: each call is one more parallel region whose
    barriers wait for descheduled threads, and the padded batch is one."""
    if len(layout.lengths) == 1 or (q.device.type == "cpu" and torch.get_num_threads() == 1):
        return segment_attention(q, k, v, layout.lengths, scale)
    return padded_causal_attention(q, k, v, layout, scale)


# It stands in for torch's varlen_attn, so it takes varlen_attn's 10 arguments as they are.
def reference_varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None,
                          window_size=(-1, -1), enable_gqa=False, **_):
    """A pure-torch ``varlen_attn`` (same signature, same [T, H, D] layout) for CPU tests and the
    GPU check's dry run. It supports what we call: equal q/k boundaries and the causal window."""
    if not torch.equal(cu_seq_q.cpu(), cu_seq_k.cpu()) or tuple(window_size) != (-1, 0):
        raise NotImplementedError("reference_varlen_attn: equal q/k boundaries and window (-1, 0) only")
    if not enable_gqa and query.shape[1] != key.shape[1]:
        raise ValueError("reference_varlen_attn: Hq != Hkv needs enable_gqa=True")
    cu = cu_seq_q.cpu().tolist()
    lengths = [b - a for a, b in zip(cu, cu[1:])]
    if max(lengths) > min(max_q, max_k):
        raise ValueError(f"max_q/max_k ({max_q}, {max_k}) below the longest call ({max(lengths)})")
    return segment_attention(query, key, value, lengths, scale)


# --- torch's varlen_attn, as the installed torch spells it ---------------------------------------

def torch_varlen_attn() -> Optional[Callable]:
    """``torch.nn.attention.varlen.varlen_attn`` if this torch has it (2.10 and later), else None."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


@functools.lru_cache(maxsize=None)
def _varlen_options(fn: Callable) -> Tuple[dict, bool]:
    """(causal keyword arguments, has enable_gqa) of a varlen_attn: torch 2.10 takes
    ``is_causal=True``; 2.11 and later take ``window_size=(-1, 0)``; ``enable_gqa`` came later."""
    params = inspect.signature(fn).parameters
    causal = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    return causal, "enable_gqa" in params


def varlen_available() -> bool:
    return torch.cuda.is_available() and torch_varlen_attn() is not None


_varlen_kernel: Optional[Callable] = None   # tests swap in reference_varlen_attn


def run_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: PackedLayout, scale: Optional[float]) -> torch.Tensor:
    """varlen_attn over q [L, Hq, D], k/v [L, Hkv, D] -> [L, Hq, D], causal within each call."""
    fn = _varlen_kernel or torch_varlen_attn()
    causal, has_gqa = _varlen_options(fn)
    extra = dict(causal)
    if q.shape[1] != k.shape[1]:
        if has_gqa:
            extra["enable_gqa"] = True
        else:   # kv head j -> query heads j*g .. j*g+g-1
            g = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    n = layout.max_len
    return fn(q.contiguous(), k.contiguous(), v.contiguous(), layout.cu_seqlens, layout.cu_seqlens, n, n,
              scale=scale, **extra)


# --- FlexAttention -------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def compiled_flex() -> Callable:
    """flex_attention compiled once for all row lengths (dynamic shapes: a different L per
    micro-batch would otherwise recompile every time; about 9 s once on a 2-core CPU)."""
    return torch.compile(flex_attention, dynamic=True)


# --- the AttentionInterface functions: [1, H, L, D] in, [1, L, H, D] out -------------------------

NO_MASK = torch.ones(1, 1, 1, 1, dtype=torch.bool)
"""What a packed forward passes as ``attention_mask``: transformers hands a 4-D mask through
untouched, so no [L, L] mask is built for a call whose boundaries travel in the layout."""


def _varlen(query, key, value, layout: PackedLayout, scaling):
    """torch varlen_attn. fp32 activations on CUDA (an fp32 model without FSDP's bf16 compute)
    are computed in bf16 and cast back, as transformers' flash_attention_2 does: FlashAttention
    has no fp32 kernel."""
    dtype = query.dtype
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))    # [L, H, D] views
    if dtype == torch.float32 and q.is_cuda:
        q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    return run_varlen(q, k, v, layout, scaling).to(dtype)[None]


def _segments(query, key, value, layout: PackedLayout, scaling):
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))
    return packed_causal_attention(q, k, v, layout, scaling)[None]


def _flex(query, key, value, layout: PackedLayout, scaling):
    """Compiled FlexAttention with the document block mask. On CPU under autograd (FlexAttention
    has no CPU backward) the layout carries no block mask and SEGMENTS computes the same thing."""
    if layout.block_mask is None:
        return _segments(query, key, value, layout, scaling)
    total = query.shape[2]
    tail = flex_length(total) - total
    q, k, v = (F.pad(t, (0, 0, 0, tail)).contiguous() for t in (query, key, value))   # one layout: one compile
    out = compiled_flex()(q, k, v, block_mask=layout.block_mask, scale=scaling, enable_gqa=q.shape[1] != k.shape[1])
    return out[:, :, :total].transpose(1, 2)


def _attention_function(kernel: Callable) -> Callable:
    """A transformers attention function: the packed ``kernel`` when the call carries a layout
    (``packed_hidden``); otherwise transformers' SDPA with the mask it built (generation by an
    HF engine that shares the trainer's model: padded rows, a KV cache)."""

    def forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        layout = kwargs.pop(LAYOUT_KWARG, None)
        if layout is None:
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                          scaling=scaling, **kwargs)
        if query.shape[0] != 1:
            raise ValueError(f"packed attention takes one packed row, got a batch of {query.shape[0]}")
        if kwargs.get("sliding_window") is not None or dropout:
            raise ValueError("packed attention implements neither sliding-window layers nor attention dropout")
        return kernel(query, key, value, layout, scaling), None

    forward.__name__ = f"packed_{kernel.__name__.strip('_')}_attention"
    return forward


KERNELS = {VARLEN: _varlen, FLEX: _flex, SEGMENTS: _segments}


def register() -> None:
    """Make our names known to transformers (idempotent). Their masks are SDPA's, for calls
    without a layout; a packed call passes ``NO_MASK`` and builds none."""
    for name, kernel in KERNELS.items():
        AttentionInterface.register(name, _attention_function(kernel))
        AttentionMaskInterface.register(name, sdpa_mask)


def packed_kwargs(impl: str, cu_seqlens: torch.Tensor, device: torch.device) -> dict:
    """The keyword arguments a packed forward under ``impl`` passes the model, computed once per
    micro-batch. FLEX gets its block mask except on CPU under autograd, where it is not used."""
    mask = impl == FLEX and not (device.type == "cpu" and torch.is_grad_enabled())
    return {"attention_mask": NO_MASK, LAYOUT_KWARG: packed_layout(cu_seqlens, device, with_block_mask=mask)}
