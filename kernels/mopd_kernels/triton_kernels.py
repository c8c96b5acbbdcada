"""Triton row passes of the lm head: softmax statistics, log-probs, entropy and the fused loss gradient.

One program handles one row of a ``[C, V]`` logits chunk that cuBLAS has just written (see
``chunked`` for the chunk loop and the memory plan). All arithmetic is fp32: every load is cast
to fp32 at once (the interpreter computes bf16 arithmetic wrongly, and fp32 is what we want on
the GPU too); gradients are stored back in the chunk's dtype, in place, so the chunk buffer is
the only ``[C, V]`` memory.

- ``_row_softmax_stats``: one online pass over the row, ``BLOCK_V`` logits at a time, keeping the
  running max ``m``, ``d = sum exp(x - m)`` and ``sum exp(x - m) (x - m)`` (rescaled when ``m``
  grows), with ``x = z / temperature``; then ``lse = m + log d``, ``H = log d - sum e (x - m) / d``.
- ``_policy_loss_kernel``: that pass, then the token's PPO/OPD/KL scalars ``g_logp``, ``g_H`` from
  its log-prob and entropy (same maths as ``terms.token_terms``), then a second pass that
  overwrites the row with ``dlogits_j = p_j (-g_logp - g_H (log p_j + H)) + g_logp [j == y]``.
- ``_logprobs_fwd_kernel`` / ``_logprobs_bwd_kernel``: the scoring pass, and the gradient pass of
  ``linear_logprobs`` from saved ``lse`` and ``H`` and the upstream gradients.

This module imports triton at import time; ``mopd_kernels`` imports it only when the Triton
backend is chosen, so the package works where triton is absent.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

# Launch configuration: (BLOCK_V, num_warps) by device kind; overridable for tuning.
_LAUNCH = {"block_v": None, "num_warps": None}


def set_launch_config(block_v: Optional[int] = None, num_warps: Optional[int] = None) -> None:
    """Fix ``BLOCK_V`` (a power of two) and ``num_warps`` for the row kernels (None: automatic)."""
    if block_v is not None and (block_v <= 0 or block_v & (block_v - 1)):
        raise ValueError(f"block_v={block_v} must be a power of two")
    _LAUNCH["block_v"] = block_v
    _LAUNCH["num_warps"] = num_warps


def launch_config(V: int, device: torch.device) -> Tuple[int, int]:
    block = _LAUNCH["block_v"] or int(os.environ.get("MOPD_KERNELS_BLOCK_V", "0"))
    warps = _LAUNCH["num_warps"] or int(os.environ.get("MOPD_KERNELS_NUM_WARPS", "0"))
    if device.type != "cuda":  # interpreter: big blocks, few Python-level iterations
        block = block or min(triton.next_power_of_2(V), 1024)
        return block, warps or 4
    # 4096 x 8 warps: ~78 registers and no spills for every kernel (sm_90, checked by the tests),
    # so three programs fit on an SM; bench/gpu_check.sh sweeps the alternatives on the GPU.
    block = block or min(triton.next_power_of_2(V), 4096)
    return block, warps or (8 if block >= 4096 else 4)


# ---------------------------------------------------------------------------------------------
# Row helpers
# ---------------------------------------------------------------------------------------------


@triton.jit
def _row_softmax_stats(row_ptr, V, inv_t, BLOCK_V: tl.constexpr):
    """Online softmax statistics of one row: (m, d, s), d = sum e, s = sum e (x - m), e = exp(x - m)."""
    m = -1e30
    d = 0.0
    s = 0.0
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        mask = offs < V
        x = tl.load(row_ptr + offs, mask=mask, other=0.0).to(tl.float32) * inv_t
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
def _row_write_grad(row_ptr, V, inv_t, shift, coef_a, coef_b, y, g_y, BLOCK_V: tl.constexpr):
    """row_j <- exp(x_j - shift) (coef_a + coef_b (x_j - shift)) + g_y [j == y], x = z * inv_t."""
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        mask = offs < V
        x = tl.load(row_ptr + offs, mask=mask, other=0.0).to(tl.float32) * inv_t
        xm = tl.where(mask, x - shift, 0.0)
        g = tl.exp(xm) * (coef_a + coef_b * xm)
        g = tl.where(offs == y, g + g_y, g)
        tl.store(row_ptr + offs, g.to(row_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _row_target_logit(row_ptr, targets_ptr, row, V, inv_t):
    """(target index or -1, its scaled logit or 0, validity) of one row."""
    y = tl.load(targets_ptr + row)
    valid = (y >= 0) & (y < V)
    x_y = tl.load(row_ptr + tl.where(valid, y, 0)).to(tl.float32) * inv_t
    return tl.where(valid, y, -1), tl.where(valid, x_y, 0.0), valid


@triton.jit
def _token_grad_scalars(logp, row, old_ptr, adv_ptr, role_ptr, table_ptr, teacher_ptr, ref_ptr,
                        clip_low, clip_high, dual_clip,
                        HAS_TEACHER: tl.constexpr, HAS_REF: tl.constexpr, HAS_DUAL: tl.constexpr):
    """d loss_t / d logp_t and d loss_t / d H_t of one trained token (maths in ``terms``)."""
    r = tl.load(role_ptr + row).to(tl.int64)
    spec = table_ptr + r * 8  # roles.ROLE_FIELDS columns: is_opd, opd, pg, ent, kl, kl_type
    is_opd = tl.load(spec + 0)
    opd_coef = tl.load(spec + 1)
    pg_coef = tl.load(spec + 2)
    ent_coef = tl.load(spec + 3)
    kl_coef = tl.load(spec + 4)
    kl_type = tl.load(spec + 5)
    old = tl.load(old_ptr + row)
    A = tl.load(adv_ptr + row)
    if HAS_TEACHER:
        teacher = tl.load(teacher_ptr + row)
        A = tl.where(is_opd != 0, opd_coef * (teacher - old), A)
    ratio = tl.exp(logp - old)
    pg1 = -A * ratio
    pg2 = -A * tl.minimum(tl.maximum(ratio, 1.0 - clip_low), 1.0 + clip_high)
    dpg = tl.where(pg1 >= pg2, pg1, 0.0)
    if HAS_DUAL:
        pg = tl.maximum(pg1, pg2)
        dpg = tl.where((A < 0) & (pg > -A * dual_clip), 0.0, dpg)
    g_logp = tl.where(pg_coef != 0, pg_coef * dpg, 0.0)
    if HAS_REF:
        delta = tl.load(ref_ptr + row) - logp
        dkl = tl.where(kl_type == 0, 1.0, tl.where(kl_type == 1, -delta, 1.0 - tl.exp(delta)))
        g_logp += tl.where(kl_coef != 0, kl_coef * dkl, 0.0)
    return g_logp, -ent_coef


# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------


@triton.jit
def _logprobs_fwd_kernel(z_ptr, stride_z, targets_ptr, logp_ptr, ent_ptr, lse_ptr, V, inv_t,
                         BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = z_ptr + row * stride_z
    m, d, s = _row_softmax_stats(row_ptr, V, inv_t, BLOCK_V)
    log_d = tl.log(d)
    _, x_y, valid = _row_target_logit(row_ptr, targets_ptr, row, V, inv_t)
    tl.store(logp_ptr + row, tl.where(valid, x_y - m - log_d, 0.0))
    tl.store(ent_ptr + row, log_d - s / d)
    tl.store(lse_ptr + row, m + log_d)


@triton.jit
def _logprobs_bwd_kernel(z_ptr, stride_z, targets_ptr, lse_ptr, ent_ptr, g_logp_ptr, g_ent_ptr, V, inv_t,
                         BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = z_ptr + row * stride_z
    lse = tl.load(lse_ptr + row)
    H = tl.load(ent_ptr + row)
    g_H = tl.load(g_ent_ptr + row)
    y, _, valid = _row_target_logit(row_ptr, targets_ptr, row, V, inv_t)
    g_logp = tl.where(valid, tl.load(g_logp_ptr + row), 0.0)
    # log p_j = x_j - lse:  dlogits_j = p_j (-g_logp - g_H H - g_H log p_j) + g_logp [j == y]
    _row_write_grad(row_ptr, V, inv_t, lse, -g_logp - g_H * H, -g_H, y, g_logp, BLOCK_V)


@triton.jit
def _policy_loss_kernel(z_ptr, stride_z, targets_ptr, old_ptr, adv_ptr, role_ptr, table_ptr, teacher_ptr,
                        ref_ptr, logp_ptr, ent_ptr, V, inv_t, clip_low, clip_high, dual_clip,
                        HAS_TEACHER: tl.constexpr, HAS_REF: tl.constexpr, HAS_DUAL: tl.constexpr,
                        WRITE_GRAD: tl.constexpr, BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = z_ptr + row * stride_z
    m, d, s = _row_softmax_stats(row_ptr, V, inv_t, BLOCK_V)
    log_d = tl.log(d)
    H = log_d - s / d
    y, x_y, valid = _row_target_logit(row_ptr, targets_ptr, row, V, inv_t)
    logp = tl.where(valid, x_y - m - log_d, 0.0)
    tl.store(logp_ptr + row, logp)
    tl.store(ent_ptr + row, H)
    if WRITE_GRAD:
        g_logp, g_H = _token_grad_scalars(logp, row, old_ptr, adv_ptr, role_ptr, table_ptr, teacher_ptr,
                                          ref_ptr, clip_low, clip_high, dual_clip,
                                          HAS_TEACHER, HAS_REF, HAS_DUAL)
        g_logp = tl.where(valid, g_logp, 0.0)
        # p_j = exp(x_j - m) / d, log p_j = (x_j - m) - log d
        inv_d = 1.0 / d
        coef_a = (-g_logp - g_H * (H - log_d)) * inv_d
        _row_write_grad(row_ptr, V, inv_t, m, coef_a, -g_H * inv_d, y, g_logp, BLOCK_V)


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
        c, V = z.shape
        if out_entropy is None:  # not wanted: the kernel writes it anyway
            out_entropy = torch.empty_like(out_logp)
        block, warps = launch_config(V, z.device)
        _logprobs_fwd_kernel[(c,)](z, z.stride(0), targets, out_logp, out_entropy, out_lse, V, inv_t,
                                   BLOCK_V=block, num_warps=warps)

    def logprobs_grad(self, z, targets, inv_t, lse, entropy, g_logp, g_entropy):
        c, V = z.shape
        block, warps = launch_config(V, z.device)
        _logprobs_bwd_kernel[(c,)](z, z.stride(0), targets, lse, entropy, g_logp.contiguous(),
                                   g_entropy.contiguous(), V, inv_t, BLOCK_V=block, num_warps=warps)
        return z

    def policy_loss(self, z, targets, inputs, settings, out_logp, out_entropy, write_grad):
        """The fused row kernel on a chunk: ``inputs`` (a ``LossInputs``) are the chunk's rows,
        ``settings`` the ``PolicyLossSettings``; the gradient overwrites ``z`` (returned)."""
        c, V = z.shape
        block, warps = launch_config(V, z.device)
        teacher, ref, dual = inputs.teacher_logp, inputs.ref_logp, settings.dual_clip
        _policy_loss_kernel[(c,)](
            z, z.stride(0), targets, inputs.old_logp, inputs.advantages, inputs.roles,
            settings.role_table(z.device),
            teacher if teacher is not None else inputs.old_logp,
            ref if ref is not None else inputs.old_logp,
            out_logp, out_entropy, V, 1.0 / settings.temperature, float(settings.clip_low),
            float(settings.clip_high), float(dual) if dual is not None else 0.0,
            HAS_TEACHER=teacher is not None, HAS_REF=ref is not None,
            HAS_DUAL=dual is not None, WRITE_GRAD=bool(write_grad), BLOCK_V=block, num_warps=warps)
        return z if write_grad else None
