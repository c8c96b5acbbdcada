"""Row-chunked lm-head passes that never hold logits for all T rows, and the pure-torch row pass.

Memory plan. Rows are processed ``C`` at a time (``chunk_rows_for``): on CPU ``C`` is sized from the
shape, so that the chunk's working set is at most half the weight gradient the call returns
(``C = H / 2`` rows for fp32, at least 256); on CUDA from a 512 MiB budget; ``MOPD_KERNELS_CHUNK_MB``
sets a fixed budget anywhere. For each chunk:

1. ``z = h_c @ W^T (+ b)`` (one matmul, cuBLAS/MKL, input dtype; ``addmm`` with an lm-head bias
   ``b``) into a reused ``[C, V]`` buffer;
2. a *row pass* (``TorchRowPass`` here, ``TritonRowPass`` in ``triton_kernels``) reads the chunk,
   computes per row the max ``m``, ``d = sum exp(s - m)`` and ``sum exp(s - m) (s - m)`` with
   ``s = z / temperature`` -- hence ``lse``, ``logp_t = s_y - lse`` and the entropy
   ``H = log d - sum e (s - m) / d`` -- and, when a gradient is wanted, overwrites the chunk with
   ``dlogits = d loss / d s`` (or returns it in a work buffer);
3. ``grad_h[c] = dlogits @ W / temperature`` and ``grad_W += dlogits^T @ h_c / temperature``
   (two more matmuls, accumulated chunk by chunk as Liger's fused linear cross entropy does);
   with a bias, ``grad_b += colsum(dlogits) / temperature`` (fp32, a ``[V]`` vector).

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

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional, Tuple

import torch

from mopd_kernels.inputs import LossInputs
from mopd_kernels.logit_map import LogitMap, as_logit_map
from mopd_kernels.settings import PolicyLossSettings
from mopd_kernels.terms import token_terms

DEFAULT_BUDGET_MB = {"cuda": 512}
"""A fixed per-chunk working-set budget (MiB) for devices without a shape rule (``CPU_SIZING``);
``MOPD_KERNELS_CHUNK_MB`` sets a fixed budget on every device."""

CPU_MIN_ROWS = 256
"""The CPU default never takes fewer rows per chunk: each chunk streams the whole of ``W`` through
three matmuls (and read-modify-writes ``grad_W``), so small chunks are bound by memory, not by the
matmuls (measured, T=8192 H=256 V=50257 fp32: 64 rows 2.5x the time of 256 rows; bench/RESULTS.md)."""

CPU_FLOOR_MB = 32
"""Nor a smaller chunk than this many MiB of logits: below it a chunk is no memory worth saving on
any machine, while every extra chunk streams ``W`` again and reorders the weight-gradient sum. It
keeps small vocabularies in one chunk per micro-batch (the tiny demo's V=1024 up to 8,192 rows, as
the 128 MiB budget before did, so its runs are unchanged bit for bit) and binds at none of the
shapes of bench/RESULTS.md's Liger table (V >= 32,768: the other two rules give more rows)."""

CPU_GRAD_FRACTION = 0.5
"""On CPU a chunk's working set is held to this fraction of the weight gradient ``V x H`` that the
call returns anyway (``rows x V x bytes_per_logit <= fraction x V x H x element size``): the chunk
then never dominates the call's memory, at any shape (rows = H / 2 for fp32)."""


def chunk_rows_for(n_rows: int, V: int, bytes_per_logit: int, device: torch.device,
                   chunk_rows: Optional[int] = None, H: int = 0, element_size: int = 4) -> int:
    """Rows per chunk: ``chunk_rows`` if given; else from ``MOPD_KERNELS_CHUNK_MB`` (a fixed budget
    over the per-row working set); else the device's default -- on CPU sized from the shape
    (``CPU_GRAD_FRACTION`` of the weight gradient, at least ``CPU_MIN_ROWS`` rows and
    ``CPU_FLOOR_MB`` of logits), elsewhere the
    ``DEFAULT_BUDGET_MB`` budget. Balanced so the chunks of ``n_rows`` have equal size (no small
    tail chunk)."""
    if n_rows <= 0:
        return 1
    if chunk_rows:
        return max(1, min(int(chunk_rows), n_rows))
    per_row = max(1, V * bytes_per_logit)
    env_mb = os.environ.get("MOPD_KERNELS_CHUNK_MB")
    if env_mb:
        max_rows = int(float(env_mb) * 2**20) // per_row
    elif device.type == "cpu":
        max_rows = max(CPU_MIN_ROWS, int(CPU_GRAD_FRACTION * V * H * element_size) // per_row,
                       (CPU_FLOOR_MB << 20) // per_row)
    else:
        max_rows = int(DEFAULT_BUDGET_MB.get(device.type, 512) * 2**20) // per_row
    max_rows = max(1, max_rows)
    n_chunks = -(-n_rows // max_rows)
    rows = -(-n_rows // n_chunks)
    if rows < n_rows and rows > 8:
        rows = min(max_rows, -(-rows // 8) * 8)
    return rows


# ---------------------------------------------------------------------------------------------
# The pure-torch row pass
# ---------------------------------------------------------------------------------------------


class ChunkSoftmax(NamedTuple):
    """The softmax of one logits chunk as ``TorchRowPass`` computes it (fp32; [C, V] or [C])."""

    L: torch.Tensor       # [C, V] log p (the chunk itself for fp32 inputs, else a work buffer)
    lse: torch.Tensor     # log sum exp s per row
    logp: torch.Tensor    # log-prob of the target, 0 where the target is outside [0, V)
    entropy: torch.Tensor
    valid: torch.Tensor   # target inside [0, V)
    safe: torch.Tensor    # [C, 1] int64 target index (0 where not valid)


EXP_TILE_ROWS = 64
"""Rows of the row pass's ``exp`` tiles: the only work buffer besides the chunk's fp32 logits."""


def log_softmax_in_place(L: torch.Tensor) -> torch.Tensor:
    """``L <- log_softmax(L)`` over rows, in place: ATen's fused row kernel (per block of rows that
    stays in cache: the max, the sum of ``exp(s - max)``, then ``s - lse`` written back), so the chunk
    is read from memory once and written once, with no ``[C, V]`` temporary."""
    try:
        return torch.log_softmax(L, dim=1, out=L)
    except RuntimeError:  # a torch that refuses the aliased out=: one temporary, same values
        return L.copy_(torch.log_softmax(L, dim=1))


class TorchRowPass:
    """Softmax statistics and logits gradients of a logits chunk with torch ops, in place.

    Memory: the chunk's logits in fp32 are the one ``[C, V]`` array (the chunk itself for fp32
    inputs, one fp32 copy for 16-bit inputs). ATen's fused ``log_softmax`` overwrites it with
    ``log p`` in place (one read and one write of the chunk: the row's max and sum of exponentials
    are taken while the row is in cache); the target's log-prob is a gather from it and the row's
    ``lse = s_y - log p_y`` (the target's logit gathered first). ``p = exp(log p)`` is never held for
    the whole chunk but made ``EXP_TILE_ROWS`` rows at a time (one ``[EXP_TILE_ROWS, V]`` buffer)
    wherever it is needed beside ``log p`` -- for the entropy ``-sum p log p`` and for the entropy
    term of the gradient -- and in place where it replaces it (the gradient without an entropy
    term). Buffers are allocated once per call and reused for every chunk.
    """

    name = "torch"

    def __init__(self):
        self._buffers = {}

    @staticmethod
    def bytes_per_logit(dtype: torch.dtype) -> int:
        # the logits chunk in the input dtype, plus its fp32 copy for 16-bit inputs (the exp tile
        # is EXP_TILE_ROWS rows, whatever the chunk's size)
        size = torch.empty((), dtype=dtype).element_size()
        return 4 if dtype == torch.float32 else size + 4

    def _buf(self, key: str, rows: int, cols: int, device) -> torch.Tensor:
        buf = self._buffers.get(key)
        if buf is None or buf.shape[0] < rows or buf.shape[1] < cols:
            buf = torch.empty(rows, cols, dtype=torch.float32, device=device)
            self._buffers[key] = buf
        return buf[:rows, :cols]

    def _tiles(self, L: torch.Tensor):
        """``(rows, L[rows], exp(L[rows]))`` for each tile of ``EXP_TILE_ROWS`` rows of ``L``
        (contiguous row blocks; the exp buffer is reused)."""
        c, V = L.shape
        for a in range(0, c, EXP_TILE_ROWS):
            Lt = L[a:a + EXP_TILE_ROWS]
            Et = torch.exp(Lt, out=self._buf("E", min(c, EXP_TILE_ROWS), V, L.device)[: Lt.shape[0]])
            yield slice(a, a + Lt.shape[0]), Lt, Et

    def _shifted(self, z: torch.Tensor, lmap: LogitMap) -> torch.Tensor:
        """``s = lmap(z)`` in fp32 (in place on ``z`` when it is fp32): ``z * inv_t``, or the soft cap."""
        L = z if z.dtype == torch.float32 else self._buf("L", z.shape[0], z.shape[1], z.device).copy_(z)
        return lmap.apply_(L)

    def _softmax(self, z: torch.Tensor, targets: torch.Tensor, inv_t,
                 with_entropy: bool = True) -> "ChunkSoftmax":
        L = self._shifted(z, as_logit_map(inv_t))
        V = z.shape[1]
        valid = (targets >= 0) & (targets < V)
        safe = torch.where(valid, targets, torch.zeros_like(targets)).long().unsqueeze(1)
        s_safe = L.gather(1, safe).squeeze(1)
        log_softmax_in_place(L)  # L = log p
        picked = L.gather(1, safe).squeeze(1)
        lse = s_safe - picked
        logp = torch.where(valid, picked, torch.zeros_like(picked))
        entropy = None
        if with_entropy:
            entropy = torch.empty_like(lse)
            for rows, Lt, Et in self._tiles(L):  # -sum p log p, no [rows, V] temporary
                entropy[rows] = torch.bmm(Et.unsqueeze(1), Lt.unsqueeze(2)).view(-1).neg_()
        return ChunkSoftmax(L, lse, logp, entropy, valid, safe)

    def stats(self, z, targets, inv_t, out_logp, out_entropy, out_lse):
        """Log-prob, entropy (skipped when ``out_entropy`` is None) and lse of each row of the chunk;
        ``inv_t`` is ``1 / temperature`` or a ``LogitMap`` (scale and soft cap too)."""
        sm = self._softmax(z, targets, inv_t, with_entropy=out_entropy is not None)
        out_logp.copy_(sm.logp)
        if out_entropy is not None:
            out_entropy.copy_(sm.entropy)
        out_lse.copy_(sm.lse)

    def _finish(self, z, G, g_logp, valid, safe):
        """Add ``g_logp`` at the target of the fp32 gradient ``G`` and hand it back in the matmul dtype."""
        G.scatter_add_(1, safe, torch.where(valid, g_logp, torch.zeros_like(g_logp)).unsqueeze(1))
        if z.dtype == torch.float32:
            return G
        return z.copy_(G)

    def _exp_times(self, L: torch.Tensor, a: torch.Tensor, b: Optional[torch.Tensor],
                   capped: Optional[Tuple[LogitMap, torch.Tensor]] = None) -> torch.Tensor:
        """``exp(L) * (a + b L)`` per row, in place on ``L`` (``b`` None: ``exp(L) * a``). ``capped``
        ``(lmap, lse)``: times the soft cap's slope ``1 - (s / cap)^2`` at ``s = L + lse``, made in the
        same tiles from ``L`` before it is overwritten (one more tile buffer)."""
        if capped is None and b is None:
            return L.exp_().mul_(a.unsqueeze(1))
        for rows, Lt, Et in self._tiles(L):
            if capped is not None:
                lmap, lse = capped
                Ft = self._buf("F", min(L.shape[0], EXP_TILE_ROWS), L.shape[1], L.device)[: Lt.shape[0]]
                lmap.slope_(torch.add(Lt, lse[rows].unsqueeze(1), out=Ft))
            if b is None:
                Lt.copy_(Et).mul_(a[rows].unsqueeze(1))
            else:
                torch.addcmul(a[rows].unsqueeze(1), Lt, b[rows].unsqueeze(1), out=Lt).mul_(Et)  # (a + b L) e^L
            if capped is not None:
                Lt.mul_(Ft)
        return L

    def policy_loss(self, z, targets, inputs: LossInputs, settings: PolicyLossSettings, out_logp, out_entropy,
                    write_grad: bool):
        """Log-probs and entropies of the chunk into ``out_*``; with ``write_grad``, the logits
        gradient of the chunk's summed token losses (``inputs`` are the chunk's rows)."""
        lmap = settings.logit_map
        sm = self._softmax(z, targets, lmap)
        out_logp.copy_(sm.logp)
        out_entropy.copy_(sm.entropy)
        if not write_grad:
            return None
        t = token_terms(sm.logp, sm.entropy, inputs, settings)
        return self._grad_from_log_p(z, sm, (t["g_logp"], t["g_entropy"]), settings.has_entropy_term, lmap)

    def _grad_from_log_p(self, z, sm: "ChunkSoftmax", g, has_entropy_term: bool, lmap: LogitMap):
        # dlogits_j = p_j (a + b log p_j) + g_logp [j == y],  a = -g_logp - g_H H,  b = -g_H
        # (each times the soft cap's slope at s_j with a cap)
        g_logp, g_entropy = g
        g_logp = torch.where(sm.valid, g_logp, torch.zeros_like(g_logp))  # logp is the constant 0 there
        a = -g_logp - g_entropy * sm.entropy
        return self._write(z, sm.L, (a, -g_entropy if has_entropy_term else None), g_logp,
                           (lmap, sm.lse, sm.valid, sm.safe))

    def _write(self, z, L, coefs, g_logp, where):
        """The gradient ``p (a + b log p) + g_logp [j == y]`` over ``L = log p``, times the cap's slope
        with a cap (at the target too), handed back in the matmul dtype. ``where``: ``(lmap, lse,
        valid, safe)``."""
        lmap, lse, valid, safe = where
        a, b = coefs
        if lmap.capped:
            s_y = L.gather(1, safe).squeeze(1) + lse  # the target's mapped logit, before L is overwritten
            g_logp = g_logp * lmap.slope_(s_y)
        G = self._exp_times(L, a, b, (lmap, lse) if lmap.capped else None)
        return self._finish(z, G, g_logp, valid, safe)

    def logprobs_grad(self, z, targets, inv_t, lse, entropy, g_logp, g_entropy):
        # dlogits_j = p_j (-g_logp - g_H (log p_j + H)) + g_logp [j == y],  log p_j = s_j - lse
        #           = p_j (a + b log p_j)  with  a = -g_logp - g_H H,  b = -g_H
        V = z.shape[1]
        lmap = as_logit_map(inv_t)
        valid = (targets >= 0) & (targets < V)
        safe = torch.where(valid, targets, torch.zeros_like(targets)).long().unsqueeze(1)
        g_logp = torch.where(valid, g_logp, torch.zeros_like(g_logp))  # logp is the constant 0 there
        L = self._shifted(z, lmap)
        L.sub_(lse.unsqueeze(1))  # log p
        return self._write(z, L, (-g_logp - g_entropy * entropy, -g_entropy), g_logp, (lmap, lse, valid, safe))


# ---------------------------------------------------------------------------------------------
# Chunk loops (shared by the torch and Triton row passes)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChunkLoop:
    """How a chunk loop walks the rows: the row pass it runs on each logits chunk, the temperature
    and the rows per chunk (None: from the memory budget, ``chunk_rows_for``)."""

    row_pass: Any  # TorchRowPass or triton_kernels.TritonRowPass
    temperature: float
    chunk_rows: Optional[int] = None
    logit_scale: float = 1.0
    """The lm head's logit scale (``logit_map``)."""
    logit_softcap: Optional[float] = None
    """The lm head's tanh soft cap (``logit_map``); None: none."""

    @property
    def logit_map(self) -> LogitMap:
        """What the row pass does to a logit: scale, soft cap, temperature (``logit_map.LogitMap``)."""
        return LogitMap.of(self.temperature, self.logit_scale, self.logit_softcap)

    @property
    def inv_t(self) -> float:
        """The constant factor of ``ds/dz`` (``scale / temperature``), folded into the gradient matmuls."""
        return self.logit_map.inv_t

    def rows_per_chunk(self, n_rows: int, hidden: torch.Tensor, V: int) -> int:
        return chunk_rows_for(n_rows, V, self.row_pass.bytes_per_logit(hidden.dtype), hidden.device,
                              self.chunk_rows, H=hidden.shape[1], element_size=hidden.element_size())


def settings_loop(row_pass, settings: PolicyLossSettings) -> ChunkLoop:
    """The chunk loop of a loss: its row pass, the settings' temperature, logit head and chunk rows."""
    return ChunkLoop(row_pass, settings.temperature, settings.chunk_rows, settings.logit_scale,
                     settings.logit_softcap)


@dataclass(frozen=True)
class GradRequest:
    """Which gradients a pass writes, and their scale."""

    hidden: bool
    weight: bool
    scale: Optional[float] = 1.0
    """The gradients are of ``scale * (the summed objective)``; None (the loss pass only) means
    ``1 / (number of trained rows)``, the default token mean."""
    bias: bool = False
    """The gradient of the lm-head bias (only where a bias is passed)."""

    @property
    def any(self) -> bool:
        return self.hidden or self.weight or self.bias


def _logits_buffer(rows: int, V: int, like: torch.Tensor) -> torch.Tensor:
    return torch.empty(rows, V, dtype=like.dtype, device=like.device)


def chunk_logits(h_c: torch.Tensor, wt: torch.Tensor, bias: Optional[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    """``h_c @ wt (+ bias)`` written into ``out`` (one matmul; the bias is added by ``addmm``)."""
    if bias is None:
        return torch.mm(h_c, wt, out=out)
    return torch.addmm(bias, h_c, wt, out=out)


def _bias_grad(bias: Optional[torch.Tensor], wanted: bool) -> Optional[torch.Tensor]:
    """The fp32 ``[V]`` accumulator of the bias gradient (cast to the bias dtype at the end)."""
    return torch.zeros(bias.shape[0], dtype=torch.float32, device=bias.device) if bias is not None and wanted else None


def _add_bias_grad(grad_b: Optional[torch.Tensor], dl: torch.Tensor, alpha: float) -> None:
    if grad_b is not None:
        grad_b.add_(dl.sum(dim=0, dtype=torch.float32), alpha=alpha)


def _bias_out(grad_b: Optional[torch.Tensor], bias: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if grad_b is None else grad_b.to(bias.dtype)


def logprobs_forward(hidden, weight, targets, loop: ChunkLoop, with_entropy: bool = True, bias=None):
    """``(logp, entropy, lse)`` fp32 [T] of every row, chunk by chunk; without the entropy (the
    scoring passes) it is not computed and comes back as zeros. ``bias``: the lm head's ``[V]`` bias."""
    T, V = hidden.shape[0], weight.shape[0]
    logp = torch.empty(T, dtype=torch.float32, device=hidden.device)
    entropy = torch.empty_like(logp) if with_entropy else torch.zeros_like(logp)
    lse = torch.empty_like(logp)
    if T == 0:
        return logp, entropy, lse
    C = loop.rows_per_chunk(T, hidden, V)
    buf = _logits_buffer(C, V, hidden)
    wt = weight.t()
    for s in range(0, T, C):
        e = min(T, s + C)
        z = chunk_logits(hidden[s:e], wt, bias, buf[: e - s])
        loop.row_pass.stats(z, targets[s:e], loop.logit_map, logp[s:e], entropy[s:e] if with_entropy else None,
                            lse[s:e])
    return logp, entropy, lse


def logprobs_backward(grad_outputs: Tuple[torch.Tensor, torch.Tensor], hidden, weight, targets,
                      saved: Tuple[torch.Tensor, torch.Tensor], loop: ChunkLoop, grads: GradRequest, bias=None):
    """Gradients of ``scale * sum(grad_logp * logp + grad_entropy * entropy)`` w.r.t. hidden, weight
    and ``bias``, ``grad_outputs = (grad_logp, grad_entropy)``, ``saved = (lse, entropy)`` of the
    forward: ``(grad_h, grad_w, grad_b)``, None for a gradient not requested.

    Recomputes each logits chunk (one matmul) and turns it into dlogits with the saved ``lse``/``H``.
    """
    T, V = hidden.shape[0], weight.shape[0]
    lse, entropy = saved
    grad_h = torch.zeros_like(hidden) if grads.hidden else None
    grad_w = torch.zeros_like(weight) if grads.weight else None
    grad_b = _bias_grad(bias, grads.bias)
    if T == 0 or not grads.any:
        return grad_h, grad_w, _bias_out(grad_b, bias)
    g_logp, g_ent = (g.float() for g in grad_outputs)
    C = loop.rows_per_chunk(T, hidden, V)
    buf = _logits_buffer(C, V, hidden)
    lmap = loop.logit_map
    alpha = lmap.inv_t * grads.scale
    wt = weight.t()
    for s in range(0, T, C):
        e = min(T, s + C)
        h_c = hidden[s:e]
        z = chunk_logits(h_c, wt, bias, buf[: e - s])
        dl = loop.row_pass.logprobs_grad(z, targets[s:e], lmap, lse[s:e], entropy[s:e], g_logp[s:e],
                                         g_ent[s:e])
        if grads.hidden:
            grad_h[s:e].addmm_(dl, weight, beta=0.0, alpha=alpha)
        if grads.weight:
            grad_w.addmm_(dl.t(), h_c, alpha=alpha)
        _add_bias_grad(grad_b, dl, alpha)
    return grad_h, grad_w, _bias_out(grad_b, bias)


@dataclass
class PolicyLossPass:
    """What one forward of the fused loss produces (trained rows only, in row order)."""

    index: Optional[torch.Tensor]  # rows of hidden that are trained; None when all are
    logp: torch.Tensor             # [n] fp32
    entropy: torch.Tensor          # [n] fp32
    grad_hidden: Optional[torch.Tensor]  # [T, H] d(sum of token losses)/dh * grad scale
    grad_weight: Optional[torch.Tensor]  # [V, H]
    grad_bias: Optional[torch.Tensor] = None  # [V], where a bias was passed and its gradient asked


def _trained_rows(inputs: LossInputs, T: int):
    """``(index, n)``: the rows with role >= 0 (None when all ``T`` are), and their number."""
    index = (inputs.roles >= 0).nonzero().squeeze(1)  # one host sync per call
    n = index.numel()
    return (None if n == T else index), n


def policy_loss_pass(hidden, weight, targets, inputs: LossInputs, settings: PolicyLossSettings, row_pass,
                     grads: GradRequest, bias=None) -> PolicyLossPass:
    """Log-probs, entropies and (scaled) gradients of the summed token losses, chunk by chunk.

    ``inputs`` as ``LossInputs.for_kernels`` makes them (fp32 values). Rows with role -1 are
    skipped entirely. The gradients are of ``grads.scale * sum_t loss_t``. A loss whose tokens are
    coupled within a sequence (``settings.per_sequence``) takes ``sequence_loss_pass``. ``bias``: the
    lm head's ``[V]`` bias (None: none).
    """
    if settings.per_sequence:
        return sequence_loss_pass(hidden, weight, targets, inputs, settings, row_pass, grads, bias)
    T, V = hidden.shape[0], weight.shape[0]
    dev = hidden.device
    index, n = _trained_rows(inputs, T)
    targets_a = targets if index is None else targets.index_select(0, index)
    trained = inputs.select(index)
    trained = dataclasses.replace(trained, roles=trained.roles.to(torch.int32).contiguous())
    logp = torch.empty(n, dtype=torch.float32, device=dev)
    entropy = torch.empty_like(logp)
    grad_h = torch.zeros_like(hidden) if grads.hidden else None
    grad_w = torch.zeros_like(weight) if grads.weight else None
    grad_b = _bias_grad(bias, grads.bias)
    if n == 0:
        return PolicyLossPass(index, logp, entropy, grad_h, grad_w, _bias_out(grad_b, bias))
    loop = settings_loop(row_pass, settings)
    C = loop.rows_per_chunk(n, hidden, V)
    buf = _logits_buffer(C, V, hidden)
    alpha = loop.inv_t * (grads.scale if grads.scale is not None else 1.0 / n)
    wt = weight.t()
    for s in range(0, n, C):
        e = min(n, s + C)
        rows = None if index is None else index[s:e]
        h_c = hidden[s:e] if rows is None else hidden.index_select(0, rows)
        z = chunk_logits(h_c, wt, bias, buf[: e - s])
        dl = row_pass.policy_loss(z, targets_a[s:e], trained.rows(s, e), settings, logp[s:e], entropy[s:e],
                                  grads.any)
        if grads.hidden:
            if rows is None:
                grad_h[s:e].addmm_(dl, weight, beta=0.0, alpha=alpha)
            else:
                grad_h.index_copy_(0, rows, torch.mm(dl, weight).mul_(alpha))
        if grads.weight:
            grad_w.addmm_(dl.t(), h_c, alpha=alpha)
        _add_bias_grad(grad_b, dl, alpha)
    return PolicyLossPass(index, logp, entropy, grad_h, grad_w, _bias_out(grad_b, bias))


def sequence_loss_pass(hidden, weight, targets, inputs: LossInputs, settings: PolicyLossSettings, row_pass,
                       grads: GradRequest, bias=None) -> PolicyLossPass:
    """``policy_loss_pass`` for a loss whose token terms depend on the whole sequence (GSPO's
    sequence ratio): every trained row's log-prob and entropy first (one matmul per chunk, the
    scoring pass), then the token terms and their gradient scalars over all rows at once, then the
    gradient pass that recomputes the logits chunk by chunk (``logprobs_backward``: three more
    matmuls). One matmul more than the token-local pass; no more memory."""
    T = hidden.shape[0]
    index, n = _trained_rows(inputs, T)
    h_a = hidden if index is None else hidden.index_select(0, index)
    targets_a = targets if index is None else targets.index_select(0, index)
    loop = settings_loop(row_pass, settings)
    logp, entropy, lse = logprobs_forward(h_a, weight, targets_a, loop, with_entropy=True, bias=bias)
    grad_h = torch.zeros_like(hidden) if grads.hidden else None
    grad_w = torch.zeros_like(weight) if grads.weight else None
    if n == 0 or not grads.any:
        return PolicyLossPass(index, logp, entropy, grad_h, grad_w, _bias_out(_bias_grad(bias, grads.bias), bias))
    trained = inputs.select(index)
    t = token_terms(logp, entropy, trained, settings)
    scale = grads.scale if grads.scale is not None else 1.0 / n
    gh_a, grad_w, grad_b = logprobs_backward((t["g_logp"], t["g_entropy"]), h_a, weight, targets_a, (lse, entropy),
                                             loop, GradRequest(grads.hidden, grads.weight, scale, grads.bias), bias)
    if grads.hidden:
        grad_h = gh_a if index is None else grad_h.index_copy_(0, index, gh_a)
    return PolicyLossPass(index, logp, entropy, grad_h, grad_w, grad_b)
