"""Row-chunked lm-head passes that never hold logits for all T rows, and the pure-torch row pass.

Memory plan. Rows are processed ``C`` at a time, with ``C`` sized from a byte budget for the
per-chunk working set (``chunk_rows``). For each chunk:

1. ``z = h_c @ W^T`` (one matmul, cuBLAS/MKL, input dtype) into a reused ``[C, V]`` buffer;
2. a *row pass* (``TorchRowPass`` here, ``TritonRowPass`` in ``triton_kernels``) reads the chunk,
   computes per row the max ``m``, ``d = sum exp(s - m)`` and ``sum exp(s - m) (s - m)`` with
   ``s = z / temperature`` -- hence ``lse``, ``logp_t = s_y - lse`` and the entropy
   ``H = log d - sum e (s - m) / d`` -- and, when a gradient is wanted, overwrites the chunk with
   ``dlogits = d loss / d s`` (or returns it in a work buffer);
3. ``grad_h[c] = dlogits @ W / temperature`` and ``grad_W += dlogits^T @ h_c / temperature``
   (two more matmuls, accumulated chunk by chunk as Liger's fused linear cross entropy does).

The logits gradient of a token is ``g_logp (onehot - p) + g_H (-p (log p + H))`` (over s), so a
row pass needs only the two scalars ``g_logp``, ``g_H`` besides the softmax statistics:

    dlogits_j = p_j (-g_logp - g_H (log p_j + H)) + g_logp [j == y].

For the loss those scalars follow from ``logp_t`` and ``H_t`` in the same pass (``terms``), so the
whole loss gradient is produced in the forward and the backward only rescales it by the upstream
gradient. For ``linear_logprobs`` (arbitrary upstream gradients) the backward recomputes the logits
chunk by chunk from the saved ``lse`` and ``H`` [T] vectors (one extra matmul, nothing big stored).

Only trained rows (role >= 0) enter the loss passes: they are gathered chunk by chunk, so prompts,
retrieved passages and padding cost neither matmuls nor softmax work.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch

from mopd.kernels.terms import token_terms

DEFAULT_BUDGET_MB = {"cpu": 128, "cuda": 512}
"""Per-chunk working-set budget (MiB); ``MOPD_KERNELS_CHUNK_MB`` overrides it."""


def chunk_rows_for(n_rows: int, V: int, bytes_per_logit: int, device: torch.device,
                   chunk_rows: Optional[int] = None) -> int:
    """Rows per chunk: ``chunk_rows`` if given, else the budget over the per-row working set,
    balanced so that the chunks of ``n_rows`` have equal size (no small tail chunk)."""
    if n_rows <= 0:
        return 1
    if chunk_rows:
        return max(1, min(int(chunk_rows), n_rows))
    budget_mb = float(os.environ.get("MOPD_KERNELS_CHUNK_MB") or DEFAULT_BUDGET_MB.get(device.type, 512))
    max_rows = max(1, int(budget_mb * 2**20) // max(1, V * bytes_per_logit))
    n_chunks = -(-n_rows // max_rows)
    rows = -(-n_rows // n_chunks)
    if rows < n_rows and rows > 8:
        rows = min(max_rows, -(-rows // 8) * 8)
    return rows


# ---------------------------------------------------------------------------------------------
# The pure-torch row pass
# ---------------------------------------------------------------------------------------------


class TorchRowPass:
    """Softmax statistics and logits gradients of a logits chunk with torch ops on fp32 buffers.

    Per row: one max, one exp, one sum, one dot (``bmm``) and, for gradients, one to three fused
    multiply passes. Work buffers (``[C, V]`` fp32, two of them, three for 16-bit inputs) are
    allocated once per call and reused for every chunk.
    """

    name = "torch"

    def __init__(self):
        self._buffers = {}

    @staticmethod
    def bytes_per_logit(dtype: torch.dtype) -> int:
        # the logits chunk in the input dtype, plus fp32 work buffers (s - m and exp), the first of
        # which is the chunk itself for fp32 inputs
        size = torch.empty((), dtype=dtype).element_size()
        return 8 if dtype == torch.float32 else size + 8

    def _buf(self, key: str, like: torch.Tensor) -> torch.Tensor:
        c, V = like.shape
        buf = self._buffers.get(key)
        if buf is None or buf.shape[0] < c:
            buf = torch.empty(c, V, dtype=torch.float32, device=like.device)
            self._buffers[key] = buf
        return buf[:c]

    def _shifted(self, z: torch.Tensor, inv_t: float) -> torch.Tensor:
        """``s = z * inv_t`` in fp32 (in place on ``z`` when it is fp32)."""
        L = z if z.dtype == torch.float32 else self._buf("L", z).copy_(z)
        if inv_t != 1.0:
            L.mul_(inv_t)
        return L

    def _softmax(self, z: torch.Tensor, targets: torch.Tensor, inv_t: float):
        L = self._shifted(z, inv_t)
        m = L.amax(dim=1)
        L.sub_(m.unsqueeze(1))  # L = s - m
        E = torch.exp(L, out=self._buf("E", z))
        d = E.sum(dim=1)
        s = torch.bmm(E.unsqueeze(1), L.unsqueeze(2)).view(-1)  # sum e (s - m), no [C, V] temporary
        log_d = torch.log(d)
        entropy = log_d - s / d
        V = z.shape[1]
        valid = (targets >= 0) & (targets < V)
        safe = torch.where(valid, targets, torch.zeros_like(targets)).long().unsqueeze(1)
        picked = L.gather(1, safe).squeeze(1) - log_d
        logp = torch.where(valid, picked, torch.zeros_like(picked))
        return L, E, m, d, log_d, logp, entropy, valid, safe

    def stats(self, z, targets, inv_t, out_logp, out_entropy, out_lse):
        _, _, m, _, log_d, logp, entropy, _, _ = self._softmax(z, targets, inv_t)
        out_logp.copy_(logp)
        out_entropy.copy_(entropy)
        out_lse.copy_(m + log_d)

    def _finish(self, z, E, g_logp, valid, safe):
        """Add ``g_logp`` at the target and hand back the gradient in the matmul dtype."""
        E.scatter_add_(1, safe, torch.where(valid, g_logp, torch.zeros_like(g_logp)).unsqueeze(1))
        if z.dtype == torch.float32:
            return E
        return z.copy_(E)

    def policy_loss(self, z, targets, inv_t, out_logp, out_entropy, write_grad, old_logp, advantages,
                    role, table, teacher_logp, ref_logp, clip_low, clip_high, dual_clip, has_entropy_term):
        L, E, _, d, log_d, logp, entropy, valid, safe = self._softmax(z, targets, inv_t)
        out_logp.copy_(logp)
        out_entropy.copy_(entropy)
        if not write_grad:
            return None
        t = token_terms(logp, entropy, old_logp, advantages, role, table, teacher_logp, ref_logp,
                        clip_low, clip_high, dual_clip)
        return self._grad_from_shifted(z, L, E, d, log_d, entropy, t["g_logp"], t["g_entropy"], valid, safe,
                                       has_entropy_term)

    def _grad_from_shifted(self, z, L, E, d, log_d, entropy, g_logp, g_entropy, valid, safe,
                           has_entropy_term):
        # dlogits_j = e_j / d * (a + b (s_j - m)),  a = -g_logp - g_H (H - log d),  b = -g_H
        a = (-g_logp - g_entropy * (entropy - log_d)) / d
        if has_entropy_term:
            b = -g_entropy / d
            L.mul_(b.unsqueeze(1)).add_(a.unsqueeze(1))
            E.mul_(L)
        else:
            E.mul_(a.unsqueeze(1))
        return self._finish(z, E, g_logp, valid, safe)

    def logprobs_grad(self, z, targets, inv_t, lse, entropy, g_logp, g_entropy):
        # dlogits_j = p_j (-g_logp - g_H (log p_j + H)) + g_logp [j == y],  log p_j = s_j - lse
        V = z.shape[1]
        valid = (targets >= 0) & (targets < V)
        safe = torch.where(valid, targets, torch.zeros_like(targets)).long().unsqueeze(1)
        g_logp = torch.where(valid, g_logp, torch.zeros_like(g_logp))  # logp is the constant 0 there
        L = self._shifted(z, inv_t)
        L.sub_(lse.unsqueeze(1))
        E = torch.exp(L, out=self._buf("E", z))
        L.add_(entropy.unsqueeze(1)).mul_(-g_entropy.unsqueeze(1)).sub_(g_logp.unsqueeze(1))
        E.mul_(L)
        return self._finish(z, E, g_logp, valid, safe)


# ---------------------------------------------------------------------------------------------
# Chunk loops (shared by the torch and Triton row passes)
# ---------------------------------------------------------------------------------------------


def _logits_buffer(rows: int, V: int, like: torch.Tensor) -> torch.Tensor:
    return torch.empty(rows, V, dtype=like.dtype, device=like.device)


def logprobs_forward(hidden, weight, targets, temperature: float, row_pass, chunk_rows: Optional[int] = None):
    """``(logp, entropy, lse)`` fp32 [T] of every row, chunk by chunk."""
    T, V = hidden.shape[0], weight.shape[0]
    logp = torch.empty(T, dtype=torch.float32, device=hidden.device)
    entropy = torch.empty_like(logp)
    lse = torch.empty_like(logp)
    if T == 0:
        return logp, entropy, lse
    C = chunk_rows_for(T, V, row_pass.bytes_per_logit(hidden.dtype), hidden.device, chunk_rows)
    buf = _logits_buffer(C, V, hidden)
    inv_t = 1.0 / temperature
    wt = weight.t()
    for s in range(0, T, C):
        e = min(T, s + C)
        z = torch.mm(hidden[s:e], wt, out=buf[: e - s])
        row_pass.stats(z, targets[s:e], inv_t, logp[s:e], entropy[s:e], lse[s:e])
    return logp, entropy, lse


def logprobs_backward(grad_logp, grad_entropy, hidden, weight, targets, lse, entropy, temperature: float,
                      row_pass, need_hidden: bool, need_weight: bool, chunk_rows: Optional[int] = None):
    """Gradients of ``sum(grad_logp * logp + grad_entropy * entropy)`` w.r.t. hidden and weight.

    Recomputes each logits chunk (one matmul) and turns it into dlogits with the saved ``lse``/``H``.
    """
    T, V = hidden.shape[0], weight.shape[0]
    grad_h = torch.zeros_like(hidden) if need_hidden else None
    grad_w = torch.zeros_like(weight) if need_weight else None
    if T == 0 or not (need_hidden or need_weight):
        return grad_h, grad_w
    g_logp = grad_logp.float()
    g_ent = grad_entropy.float()
    C = chunk_rows_for(T, V, row_pass.bytes_per_logit(hidden.dtype), hidden.device, chunk_rows)
    buf = _logits_buffer(C, V, hidden)
    inv_t = 1.0 / temperature
    wt = weight.t()
    for s in range(0, T, C):
        e = min(T, s + C)
        h_c = hidden[s:e]
        z = torch.mm(h_c, wt, out=buf[: e - s])
        dl = row_pass.logprobs_grad(z, targets[s:e], inv_t, lse[s:e], entropy[s:e], g_logp[s:e], g_ent[s:e])
        if need_hidden:
            grad_h[s:e].addmm_(dl, weight, beta=0.0, alpha=inv_t)
        if need_weight:
            grad_w.addmm_(dl.t(), h_c, alpha=inv_t)
    return grad_h, grad_w


@dataclass
class PolicyLossPass:
    """What one forward of the fused loss produces (trained rows only, in row order)."""

    index: Optional[torch.Tensor]  # rows of hidden that are trained; None when all are
    logp: torch.Tensor             # [n] fp32
    entropy: torch.Tensor          # [n] fp32
    grad_hidden: Optional[torch.Tensor]  # [T, H] d(sum of token losses)/dh * grad_scale
    grad_weight: Optional[torch.Tensor]  # [V, H]


def policy_loss_pass(hidden, weight, targets, old_logp, advantages, roles, table, teacher_logp, ref_logp,
                     clip_low: float, clip_high: float, dual_clip: Optional[float], temperature: float,
                     row_pass, need_hidden: bool, need_weight: bool, grad_scale: Optional[float] = 1.0,
                     has_entropy_term: bool = True, chunk_rows: Optional[int] = None) -> PolicyLossPass:
    """Log-probs, entropies and (scaled) gradients of the summed token losses, chunk by chunk.

    ``old_logp``, ``advantages``, ``teacher_logp``, ``ref_logp`` are fp32 [T]; ``roles`` int [T].
    Rows with role -1 are skipped entirely. The gradients are of ``grad_scale * sum_t loss_t``;
    ``grad_scale=None`` means ``1 / (number of trained rows)``, the default token mean.
    """
    T, V = hidden.shape[0], weight.shape[0]
    dev = hidden.device
    active = roles >= 0
    index = active.nonzero().squeeze(1)  # one host sync per call
    n = index.numel()
    if n == T:
        index = None

    def pick(x):
        return x if (x is None or index is None) else x.index_select(0, index)

    targets_a, old_a, adv_a, teacher_a, ref_a = map(pick, (targets, old_logp, advantages, teacher_logp,
                                                           ref_logp))
    role_a = pick(roles).to(torch.int32).contiguous()
    logp = torch.empty(n, dtype=torch.float32, device=dev)
    entropy = torch.empty_like(logp)
    write_grad = need_hidden or need_weight
    grad_h = torch.zeros_like(hidden) if need_hidden else None
    grad_w = torch.zeros_like(weight) if need_weight else None
    if n == 0:
        return PolicyLossPass(index, logp, entropy, grad_h, grad_w)
    C = chunk_rows_for(n, V, row_pass.bytes_per_logit(hidden.dtype), dev, chunk_rows)
    buf = _logits_buffer(C, V, hidden)
    inv_t = 1.0 / temperature
    alpha = inv_t * (grad_scale if grad_scale is not None else 1.0 / n)
    wt = weight.t()
    for s in range(0, n, C):
        e = min(n, s + C)
        rows = None if index is None else index[s:e]
        h_c = hidden[s:e] if rows is None else hidden.index_select(0, rows)
        z = torch.mm(h_c, wt, out=buf[: e - s])

        dl = row_pass.policy_loss(z, targets_a[s:e], inv_t, logp[s:e], entropy[s:e], write_grad,
                                  old_a[s:e], adv_a[s:e], role_a[s:e], table,
                                  None if teacher_a is None else teacher_a[s:e],
                                  None if ref_a is None else ref_a[s:e],
                                  clip_low, clip_high, dual_clip, has_entropy_term)
        if need_hidden:
            if rows is None:
                grad_h[s:e].addmm_(dl, weight, beta=0.0, alpha=alpha)
            else:
                grad_h.index_copy_(0, rows, torch.mm(dl, weight).mul_(alpha))
        if need_weight:
            grad_w.addmm_(dl.t(), h_c, alpha=alpha)
    return PolicyLossPass(index, logp, entropy, grad_h, grad_w)
