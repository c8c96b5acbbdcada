"""Triton row passes of the lm head: softmax statistics, log-probs, entropy and the fused loss gradient.

One program handles one row of a ``[C, V]`` logits chunk that cuBLAS has just written (see
``chunked`` for the chunk loop and the memory plan). All arithmetic is fp32: every load is cast
to fp32 at once (the interpreter computes bf16 arithmetic wrongly, and fp32 is what we want on
the GPU too); gradients are stored back in the chunk's dtype, in place, so the chunk buffer is
the only ``[C, V]`` memory.

- ``_row_softmax_stats``: one online pass over the row, ``BLOCK_V`` logits at a time, keeping the
  running max ``m``, ``d = sum exp(x - m)`` and ``sum exp(x - m) (x - m)`` (rescaled when ``m``
  grows), with ``x = z / temperature``; then ``lse = m + log d``, ``H = log d - sum e (x - m) / d``.
- ``_logprobs_fwd_kernel``: that pass per row: log-prob of the target, entropy, lse.
- ``_logprobs_bwd_kernel``: from the saved ``lse`` and ``H`` and two scalars per row ``g_logp``,
  ``g_H``, overwrites the row with ``dlogits_j = p_j (-g_logp - g_H (log p_j + H)) + g_logp [j == y]``.

Triton functions take pointers and scalars one by one (no structs), so their argument lists stay
flat (up to 10).

The policy loss is these two kernels around the token terms of ``terms`` (torch, on ``[C]``
vectors): the loss formulas live there only, and every objective runs on the GPU as on the CPU.

This module imports triton at import time; ``mopd_kernels`` imports it only when the Triton
backend is chosen, so the package works where triton is absent.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from mopd_kernels.logit_map import as_logit_map
from mopd_kernels.terms import token_terms

# Launch configuration: (BLOCK_V, num_warps) by device kind; overridable for tuning.
_LAUNCH = {"block_v": None, "num_warps": None}


BLOCK_V_RANGE = (64, 65536)
"""``BLOCK_V`` must be a power of two in this range (a block is one vector of a program's registers)."""
WARPS = (1, 2, 4, 8, 16, 32)


def check_launch_config(block_v: Optional[int], num_warps: Optional[int], source: str = "") -> None:
    """ValueError naming ``source`` (an environment variable, or the argument) for a bad value."""
    lo, hi = BLOCK_V_RANGE
    if block_v is not None and (not isinstance(block_v, int) or isinstance(block_v, bool) or block_v < lo
                                or block_v > hi or block_v & (block_v - 1)):
        raise ValueError(f"{source or 'block_v'}={block_v!r} must be a power of two in [{lo}, {hi}]")
    if num_warps is not None and num_warps not in WARPS:
        raise ValueError(f"{source or 'num_warps'}={num_warps!r} must be one of {WARPS}")


def set_launch_config(block_v: Optional[int] = None, num_warps: Optional[int] = None) -> None:
    """Fix ``BLOCK_V`` (a power of two) and ``num_warps`` for the row kernels (None: automatic)."""
    check_launch_config(block_v, None)
    check_launch_config(None, num_warps)
    _LAUNCH["block_v"] = block_v
    _LAUNCH["num_warps"] = num_warps


def _env_int(name: str) -> Optional[int]:
    raw = os.environ.get(name, "").strip()
    if not raw or raw == "0":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} must be an integer") from None
    if name.endswith("BLOCK_V"):
        check_launch_config(value, None, name)
    else:
        check_launch_config(None, value, name)
    return value


def launch_config(V: int, device: torch.device) -> Tuple[int, int]:
    """``(BLOCK_V, num_warps)`` of the row kernels: ``set_launch_config``'s, else
    ``MOPD_KERNELS_BLOCK_V`` / ``MOPD_KERNELS_NUM_WARPS`` (checked), else the default."""
    block = _LAUNCH["block_v"] or _env_int("MOPD_KERNELS_BLOCK_V")
    warps = _LAUNCH["num_warps"] or _env_int("MOPD_KERNELS_NUM_WARPS")
    if device.type != "cuda":  # interpreter: big blocks, few Python-level iterations
        block = block or min(triton.next_power_of_2(V), 1024)
        return block, warps or 4
    # 4096 x 8 warps: no spills for either kernel (sm_80 and sm_90, checked by the tests), so three
    # programs fit on an SM; bench/gpu_check.sh sweeps the alternatives on the GPU.
    block = block or min(triton.next_power_of_2(V), 4096)
    return block, warps or (8 if block >= 4096 else 4)


# ---------------------------------------------------------------------------------------------
# Row helpers
# ---------------------------------------------------------------------------------------------


@triton.jit
def _mapped(z, inv_t, pre, cap, HAS_CAP: tl.constexpr):
    """The softmax's input of fp32 logits ``z``: ``z * inv_t``, or soft-capped ``cap tanh(z pre)``
    (``tanh(y) = 2 sigmoid(2 y) - 1``; ``logit_map.LogitMap``)."""
    if HAS_CAP:
        return cap * (2.0 * tl.sigmoid(2.0 * pre * z) - 1.0)
    else:
        return z * inv_t


@triton.jit
def _row_softmax_stats(row_ptr, V, inv_t, pre, cap, HAS_CAP: tl.constexpr, BLOCK_V: tl.constexpr):
    """Online softmax statistics of one row: (m, d, s), d = sum e, s = sum e (x - m), e = exp(x - m)."""
    m = -1e30
    d = 0.0
    s = 0.0
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        mask = offs < V
        x = _mapped(tl.load(row_ptr + offs, mask=mask, other=0.0).to(tl.float32), inv_t, pre, cap, HAS_CAP)
        m_new = tl.maximum(m, tl.max(tl.where(mask, x, -float("inf")), axis=0))
        alpha = tl.exp(m - m_new)
        xm = tl.where(mask, x - m_new, 0.0)
        e = tl.where(mask, tl.exp(xm), 0.0)
        # sum e (x - m_new) = alpha * (s_old + (m_old - m_new) d_old) + this block's share
        s = alpha * (s + (m - m_new) * d) + tl.sum(e * xm, axis=0)
        d = alpha * d + tl.sum(e, axis=0)
        m = m_new
    return m, d, s


@triton.jit
def _row_write_grad(row_ptr, V, inv_t, pre, cap, shift, coef_a, coef_b, y, g_y, HAS_CAP: tl.constexpr,
                    BLOCK_V: tl.constexpr):
    """row_j <- exp(x_j - shift) (coef_a + coef_b (x_j - shift)) + g_y [j == y], x = _mapped(z); with a
    soft cap, times its slope 1 - (x_j / cap)^2."""
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        mask = offs < V
        x = _mapped(tl.load(row_ptr + offs, mask=mask, other=0.0).to(tl.float32), inv_t, pre, cap, HAS_CAP)
        xm = tl.where(mask, x - shift, 0.0)
        g = tl.exp(xm) * (coef_a + coef_b * xm)
        g = tl.where(offs == y, g + g_y, g)
        if HAS_CAP:
            t = x / cap
            g = g * (1.0 - t * t)
        tl.store(row_ptr + offs, g.to(row_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _row_target_logit(row_ptr, targets_ptr, row, V, inv_t, pre, cap, HAS_CAP: tl.constexpr):
    """(target index or -1, its mapped logit or 0, validity) of one row."""
    y = tl.load(targets_ptr + row)
    valid = (y >= 0) & (y < V)
    x_y = _mapped(tl.load(row_ptr + tl.where(valid, y, 0)).to(tl.float32), inv_t, pre, cap, HAS_CAP)
    return tl.where(valid, y, -1), tl.where(valid, x_y, 0.0), valid


# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------


@triton.jit
def _logprobs_fwd_kernel(z_ptr, stride_z, targets_ptr, logp_ptr, ent_ptr, lse_ptr, V, inv_t, pre, cap,
                         HAS_CAP: tl.constexpr, BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = z_ptr + row * stride_z
    m, d, s = _row_softmax_stats(row_ptr, V, inv_t, pre, cap, HAS_CAP, BLOCK_V)
    log_d = tl.log(d)
    _, x_y, valid = _row_target_logit(row_ptr, targets_ptr, row, V, inv_t, pre, cap, HAS_CAP)
    tl.store(logp_ptr + row, tl.where(valid, x_y - m - log_d, 0.0))
    tl.store(ent_ptr + row, log_d - s / d)
    tl.store(lse_ptr + row, m + log_d)


@triton.jit
def _logprobs_bwd_kernel(z_ptr, stride_z, targets_ptr, lse_ptr, ent_ptr, g_logp_ptr, g_ent_ptr, V, inv_t, pre, cap,
                         HAS_CAP: tl.constexpr, BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = z_ptr + row * stride_z
    lse = tl.load(lse_ptr + row)
    H = tl.load(ent_ptr + row)
    g_H = tl.load(g_ent_ptr + row)
    y, _, valid = _row_target_logit(row_ptr, targets_ptr, row, V, inv_t, pre, cap, HAS_CAP)
    g_logp = tl.where(valid, tl.load(g_logp_ptr + row), 0.0)
    # log p_j = x_j - lse:  dlogits_j = p_j (-g_logp - g_H H - g_H log p_j) + g_logp [j == y]
    _row_write_grad(row_ptr, V, inv_t, pre, cap, lse, -g_logp - g_H * H, -g_H, y, g_logp, HAS_CAP, BLOCK_V)


# ---------------------------------------------------------------------------------------------
# The row pass used by the chunk loops in ``chunked``
# ---------------------------------------------------------------------------------------------


class TritonRowPass:
    """Launches the row kernels on a logits chunk, in place (no work buffers)."""

    name = "triton"

    @staticmethod
    def bytes_per_logit(dtype: torch.dtype) -> int:
        return torch.empty((), dtype=dtype).element_size()

    def stats(self, z, targets, inv_t, out_logp, out_entropy, out_lse):
        """``inv_t``: ``1 / temperature`` or a ``LogitMap`` (scale and soft cap too)."""
        c, V = z.shape
        if out_entropy is None:  # not wanted: the kernel writes it anyway
            out_entropy = torch.empty_like(out_logp)
        block, warps = launch_config(V, z.device)
        lmap = as_logit_map(inv_t)
        _logprobs_fwd_kernel[(c,)](z, z.stride(0), targets, out_logp, out_entropy, out_lse, V, lmap.inv_t, lmap.pre,
                                   lmap.cap or 1.0, HAS_CAP=lmap.capped, BLOCK_V=block, num_warps=warps)

    def logprobs_grad(self, z, targets, inv_t, lse, entropy, g_logp, g_entropy):
        c, V = z.shape
        block, warps = launch_config(V, z.device)
        lmap = as_logit_map(inv_t)
        _logprobs_bwd_kernel[(c,)](z, z.stride(0), targets, lse, entropy, g_logp.contiguous(),
                                   g_entropy.contiguous(), V, lmap.inv_t, lmap.pre, lmap.cap or 1.0,
                                   HAS_CAP=lmap.capped, BLOCK_V=block, num_warps=warps)
        return z

    def policy_loss(self, z, targets, inputs, settings, out_logp, out_entropy, write_grad):
        """The loss's row pass on a chunk: the statistics kernel, the token terms and their gradient
        scalars in torch (``terms``, on ``[C]`` vectors: the kernels hold no loss formula), then the
        gradient kernel; ``inputs`` (a ``LossInputs``) are the chunk's rows, ``settings`` the
        ``PolicyLossSettings``. The gradient overwrites ``z`` (returned)."""
        inv_t = settings.logit_map
        lse = torch.empty_like(out_logp)
        self.stats(z, targets, inv_t, out_logp, out_entropy, lse)
        if not write_grad:
            return None
        t = token_terms(out_logp, out_entropy, inputs, settings)
        return self.logprobs_grad(z, targets, inv_t, lse, out_entropy, t["g_logp"], t["g_entropy"])
