"""The CPU row pass compiled by ``torch.compile`` (inductor's C++ codegen), with the eager one as fallback.

The eager ``TorchRowPass`` walks each ``[C, V]`` logits chunk five to seven times (max, ``- m``, ``exp``
into a tile, sums, the entropy's product, then ``exp`` again and the gradient), each a separate
vectorised loop over memory that no cache holds. Compiled, a chunk costs two sweeps:

1. ``softmax_sums``: per row, ``m = max s`` then ``d = sum exp(s - m)`` (and ``sum exp(s - m) (s - m)``
   when the entropy is wanted) -- inductor fuses both reductions into one parallel loop over rows,
   so the second reads the row (V floats, 200 KB at V=50k) from L2, not from memory. The log-prob
   then needs only the target's logit ``s_y`` (a gather of C numbers): ``logp = s_y - m - log d``.
2. ``write_logit_grads`` (only when a gradient is wanted): one elementwise sweep that overwrites the
   chunk in place with ``dlogits_j = p_j (a + b log p_j) + g [j == y]``, ``log p_j = s_j - lse``.
   With ``a = -g_logp - g_H H`` and ``b = -g_H`` this is the gradient of ``g_logp logp + g_H H``
   (``chunked``'s formula), for the loss and for ``linear_logprobs``' backward alike.

``exp`` is Cephes' single-precision exp written in torch ops (``exp_nonpositive``): inductor
vectorises it into about a dozen AVX2 instructions per 8 floats, about twice as fast as the
library ``exp`` it would otherwise call, within 1e-7 relative error. Its inputs are ``s - max`` or
``s - lse``, so never much above 0.

Memory: the same chunk, nothing of size ``[C, V]`` besides it (16-bit inputs are read and written in
their own dtype, with no fp32 copy); outputs are ``[C]`` vectors. ``bytes_per_logit`` is the eager
pass's, so both size chunks alike.

When it runs: once turned on (``set_compiled_cpu_rows(True)`` or ``MOPD_KERNELS_COMPILE=1``; off by
default for library use, since the first call compiles), CPU tensors with ``V >= COMPILED_MIN_VOCAB``
(below, and so at the tiny demo's V of about 1k, the eager pass runs and its bits are unchanged),
unless ``MOPD_KERNELS_COMPILE=0``, a
Python dispatch mode is active (``memtrack`` counts the eager pass's tensors), dynamo is tracing
the caller, or compiling failed once in this process (a warning, then the eager pass for good). The
row count is marked dynamic, so new chunk sizes reuse the compiled code; each vocabulary size and
dtype compiles once (a few seconds, then inductor's on-disk cache).
"""

from __future__ import annotations

import os
import warnings

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from mopd_kernels.chunked import TorchRowPass
from mopd_kernels.logit_map import LogitMap, as_logit_map
from mopd_kernels.terms import token_terms

COMPILED_MIN_VOCAB = 8192
"""Vocabularies below this keep the eager row pass: there the row pass is a small share of the
matmuls, and the tiny demo's runs (V about 1k) stay bit for bit what they were."""

LOG2E = 1.4426950408889634
LN2_HI, LN2_LO = 0.693359375, -2.12194440e-4   # ln 2 = LN2_HI + LN2_LO, LN2_HI exact in 9 bits
EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
            5.0000001201e-1)
"""Cephes' minimax coefficients: ``exp(r) = 1 + r + r^2 P(r)`` for ``|r| <= ln2 / 2``."""
EXP_UNDERFLOW = -88.5
"""Below this ``exp`` is under 4e-39 and returned as 0 (the scale ``2^n`` becomes 0 at n = -127)."""


def exp_nonpositive(x: torch.Tensor) -> torch.Tensor:
    """``exp(x)`` in fp32 for ``x <= ~80`` (used on ``x <= ~0``): ``x = n ln2 + r``, ``|r| <= ln2/2``,
    ``exp(x) = 2^n exp(r)`` with ``2^n`` built from its exponent bits. Max relative error ~1e-7."""
    x = x.clamp(min=EXP_UNDERFLOW)
    n = torch.floor(x * LOG2E + 0.5).clamp(min=-127.0)
    r = x - n * LN2_HI - n * LN2_LO
    p = EXP_POLY[0]
    for c in EXP_POLY[1:]:
        p = p * r + c
    exp_r = p * r * r + r + 1.0
    return exp_r * ((n.to(torch.int32) + 127) << 23).view(torch.float32)


def mapped_logits(z: torch.Tensor, inv_t: torch.Tensor, cap=None) -> torch.Tensor:
    """``s`` of a chunk in fp32: ``z * inv_t``, or with ``cap = (pre, c)`` (0-d fp32 tensors) the soft
    cap ``c tanh(z pre)`` (``logit_map.LogitMap``)."""
    if cap is None:
        return z.float() * inv_t
    pre, c = cap
    return torch.tanh(z.float() * pre) * c


def softmax_sums(z: torch.Tensor, inv_t: torch.Tensor, with_entropy: bool, cap=None):
    """Per row of ``s = z * inv_t`` (fp32; ``mapped_logits``, soft-capped with ``cap``): ``m = max s``,
    ``d = sum exp(s - m)`` and, with the entropy, ``sum exp(s - m) (s - m)`` (else None). ``z`` [C, V]
    any float dtype, ``inv_t`` 0-d fp32."""
    s = mapped_logits(z, inv_t, cap)
    m = s.amax(dim=1, keepdim=True)
    L = s - m
    e = exp_nonpositive(L)
    d = e.sum(dim=1)
    return m.squeeze(1), d, (e * L).sum(dim=1) if with_entropy else None


def write_logit_grads(z: torch.Tensor, inv_t: torch.Tensor, lse: torch.Tensor, a: torch.Tensor,
                      b: torch.Tensor, target: torch.Tensor, g: torch.Tensor, cap=None) -> None:
    """``z[i, j] <- p_ij (a_i + b_i log p_ij) + g_i [j == target_i]`` in place, ``log p = s - lse``
    (``s = mapped_logits(z, inv_t, cap)``) computed in fp32 and stored in ``z``'s dtype; with a soft
    cap each entry is times its slope ``1 - (s / c)^2`` (all but ``z``: fp32 [C], ``target`` int64 [C])."""
    s = mapped_logits(z, inv_t, cap)
    log_p = s - lse.unsqueeze(1)
    cols = torch.arange(z.shape[1], device=z.device)
    onehot = torch.where(cols == target.unsqueeze(1), g.unsqueeze(1), 0.0)
    grad = exp_nonpositive(log_p) * (a.unsqueeze(1) + b.unsqueeze(1) * log_p) + onehot
    if cap is not None:
        t = s / cap[1]
        grad = grad * (1.0 - t * t)
    z.copy_(grad)


_COMPILED = {}
_FAILED = []


def _kernel(name: str):
    fn = _COMPILED.get(name)
    if fn is None:
        fn = torch.compile({"sums": softmax_sums, "grads": write_logit_grads}[name])
        _COMPILED[name] = fn
    return fn


RECOMPILE_LIMIT = 64
"""Compiled variants kept per kernel (dynamo's default, 8, is global): one per vocabulary size,
dtype and entropy flag; past it dynamo would run the kernel's Python uncompiled (right, but with
``[C, V]`` temporaries)."""


def _run(name: str, *args):
    """The compiled kernel ``name`` on ``args``: rows dynamic (any chunk size reuses the code), the
    vocabulary static (inductor then fuses the row's max and sums into one loop), under no_grad."""
    for t in args:
        if isinstance(t, torch.Tensor) and t.dim() >= 1:
            torch._dynamo.maybe_mark_dynamic(t, 0)
            if t.dim() == 2:
                torch._dynamo.mark_static(t, 1)
    with torch.no_grad(), torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
        return _kernel(name)(*args)


def _target_index(targets: torch.Tensor, V: int):
    """``(valid, safe)``: targets inside ``[0, V)``, and the int64 index (0 where not valid)."""
    valid = (targets >= 0) & (targets < V)
    return valid, torch.where(valid, targets, torch.zeros_like(targets)).long()


_ENABLED = []


def set_compiled_cpu_rows(enabled: bool) -> None:
    """Turn the compiled CPU row pass on or off for this process (``MOPD_KERNELS_COMPILE=1``/``0``
    says the same from the environment, and wins over this call).

    Off by default for library use: the first call at each vocabulary size and dtype compiles for
    half a minute on a cold cache (seconds once inductor's on-disk cache holds it), while every
    later call runs at 1.0-1.2x the bare matmuls instead of the eager pass's (bench/RESULTS.md). A
    long job (a trainer) turns it on; a short script or a test keeps the eager pass.
    """
    _ENABLED[:] = [bool(enabled)]


def compile_enabled() -> bool:
    env = os.environ.get("MOPD_KERNELS_COMPILE", "").strip()
    wanted = env not in ("0", "") if env else bool(_ENABLED and _ENABLED[0])
    return wanted and not _FAILED


def _dispatch_mode_active() -> bool:
    return _get_current_dispatch_mode() is not None


class CompiledRowPass(TorchRowPass):
    """``TorchRowPass``'s interface with the compiled sweeps above where they apply (``uses_compiled``),
    the eager pass elsewhere."""

    name = "torch"

    def __init__(self):
        super().__init__()
        self._scalars = {}

    def uses_compiled(self, z: torch.Tensor) -> bool:
        return (z.device.type == "cpu" and z.shape[1] >= COMPILED_MIN_VOCAB and compile_enabled()
                and not torch.compiler.is_compiling() and not _dispatch_mode_active())

    def _scalar(self, x: float) -> torch.Tensor:
        t = self._scalars.get(x)
        if t is None:
            t = self._scalars[x] = torch.tensor(x, dtype=torch.float32)
        return t

    def _map_args(self, lmap: LogitMap):
        """The compiled kernels' ``(inv_t, cap)`` arguments of a logit map (0-d fp32 tensors; ``cap``
        ``(pre, c)`` or None)."""
        cap = None if lmap.cap is None else (self._scalar(lmap.pre), self._scalar(lmap.cap))
        return self._scalar(lmap.inv_t), cap

    def _try(self, name: str, *args):
        """``(True, the kernel's result)``, or ``(False, None)`` when compiling fails (warned once;
        the eager pass from then on)."""
        try:
            return True, _run(name, *args)
        except Exception as exc:  # no C++ compiler, an inductor bug: the eager pass is always right
            _FAILED.append(repr(exc))
            warnings.warn(f"mopd_kernels: the compiled CPU row pass is unavailable ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); using the eager one",
                          RuntimeWarning, stacklevel=3)
            return False, None

    def _target_stats(self, z, targets, lmap: LogitMap, with_entropy: bool):
        """``(logp, entropy or None, lse)`` of a chunk by the compiled sums, or None."""
        inv_t, cap = self._map_args(lmap)
        ok, sums = self._try("sums", z, inv_t, with_entropy, cap)
        if not ok:
            return None
        m, d, e_L = sums
        valid, safe = _target_index(targets, z.shape[1])
        log_d = torch.log(d)
        s_y = lmap.apply_(z.gather(1, safe.unsqueeze(1)).squeeze(1).float())
        logp = torch.where(valid, s_y - m - log_d, torch.zeros_like(log_d))
        entropy = log_d - e_L / d if with_entropy else None
        return logp, entropy, m + log_d

    def stats(self, z, targets, inv_t, out_logp, out_entropy, out_lse):
        if self.uses_compiled(z):
            got = self._target_stats(z, targets, as_logit_map(inv_t), out_entropy is not None)
            if got is not None:
                logp, entropy, lse = got
                out_logp.copy_(logp)
                out_lse.copy_(lse)
                if out_entropy is not None:
                    out_entropy.copy_(entropy)
                return
        super().stats(z, targets, inv_t, out_logp, out_entropy, out_lse)

    def _write_grads(self, z, lmap: LogitMap, lse, entropy, g_logp, g_entropy, targets) -> bool:
        """Overwrite ``z`` with the logits gradient of ``g_logp logp + g_entropy H``; False (``z``
        untouched) when compiling fails."""
        valid, safe = _target_index(targets, z.shape[1])
        g_logp = torch.where(valid, g_logp, torch.zeros_like(g_logp))  # logp is the constant 0 there
        g_entropy = torch.broadcast_to(g_entropy, g_logp.shape).float()
        a = -g_logp - g_entropy * entropy
        inv_t, cap = self._map_args(lmap)
        ok, _ = self._try("grads", z, inv_t, lse, a.contiguous(), (-g_entropy).contiguous(), safe,
                          g_logp.contiguous(), cap)
        return ok

    def logprobs_grad(self, z, targets, inv_t, lse, entropy, g_logp, g_entropy):
        if self.uses_compiled(z) and self._write_grads(z, as_logit_map(inv_t), lse, entropy, g_logp, g_entropy,
                                                       targets):
            return z
        return super().logprobs_grad(z, targets, inv_t, lse, entropy, g_logp, g_entropy)

    def policy_loss(self, z, targets, inputs, settings, out_logp, out_entropy, write_grad: bool):
        lmap = settings.logit_map
        got = self._target_stats(z, targets, lmap, True) if self.uses_compiled(z) else None
        if got is None:
            return super().policy_loss(z, targets, inputs, settings, out_logp, out_entropy, write_grad)
        logp, entropy, lse = got
        out_logp.copy_(logp)
        out_entropy.copy_(entropy)
        if not write_grad:
            return None
        t = token_terms(logp, entropy, inputs, settings)
        g_entropy = t["g_entropy"] if settings.has_entropy_term else torch.zeros_like(logp)
        if not self._write_grads(z, lmap, lse, entropy, t["g_logp"], g_entropy, targets):
            # compiling failed after the sums compiled: redo the chunk eagerly (z still holds the logits)
            return super().policy_loss(z, targets, inputs, settings, out_logp, out_entropy, write_grad)
        return z
