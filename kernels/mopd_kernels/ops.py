"""The public entry points: ``linear_logprobs``, ``fused_linear_policy_loss`` (and its module form
``FusedLinearPolicyLoss``), and their backends.

- ``linear_logprobs`` is the ``torch.library`` custom op ``mopd_kernels::linear_logprobs`` (with a
  registered fake and autograd formula), so it traces under ``torch.compile`` and FSDP2 as one
  opaque node. Its backward is the custom op ``mopd_kernels::linear_logprobs_backward``, which
  recomputes the logits chunk by chunk (no [T, V] tensor is saved between forward and backward).
- ``fused_linear_policy_loss`` is a ``torch.autograd.Function``: its forward computes the loss,
  the per-role stats *and* the gradients w.r.t. hidden and weight (Liger style), and its backward
  only scales those by the upstream gradient. It is not a custom op (it returns Python stats and
  holds gradients between forward and backward); ``torch.compile`` graph-breaks around it. Its
  hyperparameters are one frozen ``PolicyLossSettings``, its per-token tensors one ``LossInputs``.

Backends: ``"triton"`` (compiled on CUDA; the interpreter on CPU when TRITON_INTERPRET=1),
``"torch"`` (the chunked pure-torch path), ``"reference"`` (full logits, plain autograd) and
``"auto"`` (triton on CUDA when triton imports, torch elsewhere).
"""

from __future__ import annotations

import os
from typing import Dict, Optional, Tuple, Union

import torch

from mopd_kernels import chunked, reference
from mopd_kernels.compiled_rows import CompiledRowPass
from mopd_kernels.inputs import LossInputs
from mopd_kernels.logit_map import check_logit_head
from mopd_kernels.roles import (check_backend, check_bias, check_linear_inputs, check_loss_inputs, check_target_range,
                                check_temperature)
from mopd_kernels.settings import PolicyLossSettings, require_settings
from mopd_kernels.terms import role_stats, token_terms

Stats = Dict[int, Dict[str, torch.Tensor]]


# ---------------------------------------------------------------------------------------------
# Backends
# ---------------------------------------------------------------------------------------------


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def resolve_backend(backend: str, device: torch.device) -> str:
    """The concrete backend ``"triton" | "torch" | "reference"`` for tensors on ``device``."""
    check_backend(backend)
    if backend == "auto":
        return "triton" if device.type == "cuda" and triton_available() else "torch"
    if backend == "triton":
        if not triton_available():
            raise ValueError("backend='triton' but triton is not installed; use backend='torch'")
        if device.type != "cuda" and not interpreter_enabled():
            raise ValueError("backend='triton' needs CUDA tensors (or TRITON_INTERPRET=1 set before triton "
                             f"is imported, for tests); got tensors on {device}")
    return backend


def _full_weight(weight):
    """An FSDP2-sharded (DTensor) lm-head weight gathered whole, differentiably (its gradient goes
    back sharded); a plain tensor as it is."""
    return weight.full_tensor() if type(weight).__name__ == "DTensor" else weight


def matmul_inputs(hidden: torch.Tensor, weight: torch.Tensor, matmul_dtype: Optional[torch.dtype] = None,
                  bias: Optional[torch.Tensor] = None):
    """``(hidden, weight)`` in the lm-head matmul's dtype: ``matmul_dtype`` if given, else the autocast
    dtype when autocast is on for their device (as ``F.linear`` would run), else their own (a
    mismatch is then a ValueError). The casts are differentiable: gradients come back in each
    input's own dtype. With a ``bias``, ``(hidden, weight, bias)``, the bias cast alike."""
    weight = _full_weight(weight)
    if bias is not None:
        bias = _full_weight(bias)
    dtype = matmul_dtype
    if dtype is None and isinstance(hidden, torch.Tensor) and torch.is_autocast_enabled(hidden.device.type):
        dtype = torch.get_autocast_dtype(hidden.device.type)
    tensors = (hidden, weight) if bias is None else (hidden, weight, bias)
    if dtype is None or not all(isinstance(t, torch.Tensor) for t in tensors):
        return tensors  # the argument checks name a bad one
    return tuple(t.to(dtype) for t in tensors)


def row_pass_for(backend: str):
    if backend == "triton":
        from mopd_kernels.triton_kernels import TritonRowPass

        return TritonRowPass()
    if backend == "torch":
        return CompiledRowPass()
    raise ValueError(f"backend={backend!r} has no row pass")


# ---------------------------------------------------------------------------------------------
# linear_logprobs: custom ops
# ---------------------------------------------------------------------------------------------


def _chunk_loop(temperature: float, backend: str, chunk_rows: int,
                head: Tuple[float, float] = (1.0, 0.0)) -> chunked.ChunkLoop:
    """``head``: the op's ``(logit_scale, logit_softcap)``, a cap of 0 meaning none."""
    scale, softcap = head
    return chunked.ChunkLoop(row_pass_for(backend), temperature, chunk_rows or None, scale, softcap or None)


def _linear_logprobs_impl(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          temperature: float, backend: str, chunk_rows: int, with_entropy: bool = True,
                          bias: Optional[torch.Tensor] = None, logit_scale: float = 1.0,
                          logit_softcap: float = 0.0) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logp, entropy, lse) fp32 [T] by the chunked loop of ``backend`` (``"torch"`` or ``"triton"``);
    without ``with_entropy`` the entropy is zeros (not computed: one reduction less per logit).
    ``logit_softcap`` 0 is no cap (an op's schema has no optional float). Targets at or past V are
    refused here, inside the op (a compiled caller checks them too)."""
    check_target_range(targets, weight.shape[0])
    loop = _chunk_loop(temperature, backend, chunk_rows, (logit_scale, logit_softcap))
    return chunked.logprobs_forward(hidden, weight, targets, loop, with_entropy, bias)


_linear_logprobs_op = torch.library.custom_op("mopd_kernels::linear_logprobs", mutates_args=())(
    _linear_logprobs_impl)


@_linear_logprobs_op.register_fake
def _linear_logprobs_fake(hidden, weight, targets, temperature, backend, chunk_rows, with_entropy=True, bias=None,
                          logit_scale=1.0, logit_softcap=0.0):
    T = hidden.shape[0]
    return tuple(hidden.new_empty(T, dtype=torch.float32) for _ in range(3))


# A torch custom_op's schema takes tensors and scalars only, so its 16 arguments stay flat (no settings object).
def _linear_logprobs_backward_impl(grad_logp: torch.Tensor, grad_entropy: torch.Tensor, hidden: torch.Tensor,
                                   weight: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor,
                                   entropy: torch.Tensor, temperature: float, backend: str, chunk_rows: int,
                                   need_hidden: bool, need_weight: bool, bias: Optional[torch.Tensor] = None,
                                   need_bias: bool = False, logit_scale: float = 1.0,
                                   logit_softcap: float = 0.0) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad_hidden, grad_weight, grad_bias); an empty tensor stands for a gradient that is not needed."""
    gh, gw, gb = chunked.logprobs_backward((grad_logp, grad_entropy), hidden, weight, targets, (lse, entropy),
                                           _chunk_loop(temperature, backend, chunk_rows,
                                                       (logit_scale, logit_softcap)),
                                           chunked.GradRequest(need_hidden, need_weight, bias=need_bias), bias)
    return (gh if gh is not None else hidden.new_empty(0), gw if gw is not None else weight.new_empty(0),
            gb if gb is not None else weight.new_empty(0))


_linear_logprobs_backward_op = torch.library.custom_op(
    "mopd_kernels::linear_logprobs_backward", mutates_args=())(_linear_logprobs_backward_impl)

CUSTOM_OP_IMPLS = {
    "mopd_kernels::linear_logprobs": _linear_logprobs_impl,
    "mopd_kernels::linear_logprobs_backward": _linear_logprobs_backward_impl,
}
"""The Python bodies of this package's custom ops (``memtrack`` runs them to see inside)."""


# The op's fake takes the op's schema: the same flat arguments.
@_linear_logprobs_backward_op.register_fake
def _linear_logprobs_backward_fake(grad_logp, grad_entropy, hidden, weight, targets, lse, entropy,
                                   temperature, backend, chunk_rows, need_hidden, need_weight, bias=None,
                                   need_bias=False, logit_scale=1.0, logit_softcap=0.0):
    return (torch.empty_like(hidden) if need_hidden else hidden.new_empty(0),
            torch.empty_like(weight) if need_weight else weight.new_empty(0),
            torch.empty_like(bias) if need_bias and bias is not None else weight.new_empty(0))


def _linear_logprobs_setup_context(ctx, inputs, output):
    hidden, weight, targets, temperature, backend, chunk_rows = inputs[:6]
    bias = inputs[7] if len(inputs) > 7 else None
    head = (inputs[8] if len(inputs) > 8 else 1.0, inputs[9] if len(inputs) > 9 else 0.0)
    _, entropy, lse = output
    ctx.save_for_backward(hidden, weight, targets, lse, entropy, bias)
    ctx.config = (temperature, backend, chunk_rows, head)


def _linear_logprobs_backward(ctx, grad_logp, grad_entropy, grad_lse):
    hidden, weight, targets, lse, entropy, bias = ctx.saved_tensors
    temperature, backend, chunk_rows, (logit_scale, logit_softcap) = ctx.config
    need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    need_b = bias is not None and len(ctx.needs_input_grad) > 7 and ctx.needs_input_grad[7]
    if grad_logp is None:
        grad_logp = torch.zeros_like(lse)
    if grad_entropy is None:
        grad_entropy = torch.zeros_like(lse)
    gh, gw, gb = torch.ops.mopd_kernels.linear_logprobs_backward(
        grad_logp, grad_entropy, hidden, weight, targets, lse, entropy, temperature, backend, chunk_rows,
        need_h, need_w, bias, need_b, logit_scale, logit_softcap)
    return (gh if need_h else None, gw if need_w else None, None, None, None, None, None, gb if need_b else None,
            None, None)


torch.library.register_autograd("mopd_kernels::linear_logprobs", _linear_logprobs_backward,
                                setup_context=_linear_logprobs_setup_context)


def linear_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                    temperature: float = 1.0, with_entropy: bool = True, backend: str = "auto",
                    chunk_rows: Optional[int] = None, bias: Optional[torch.Tensor] = None,
                    logit_scale: float = 1.0,
                    logit_softcap: Optional[float] = None) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Log-prob of each target and entropy of each row of ``softmax((hidden @ weight.T + bias) / temperature)``,
    or with an lm head that scales or caps its logits (``logit_scale``, ``logit_softcap``: Cohere, Gemma 2)
    of ``softmax(softcap * tanh(logit_scale * z / softcap) / temperature)`` (``mopd_kernels.logit_map``).

    ``hidden`` [T, H] (fp32/bf16/fp16), ``weight`` [V, H] of the same dtype, ``targets`` [T] int,
    ``bias`` the lm head's optional [V] bias (its gradient included).
    Returns ``logp`` [T] fp32 and ``entropy`` [T] fp32 (None when ``with_entropy=False``: then it
    is not computed, which spares the scoring passes a reduction over every logit). A negative target
    (the ignore index, e.g. -100) means "no target": logp 0 and no gradient; a target at or past V is
    a ValueError. Differentiable w.r.t. ``hidden``, ``weight`` and ``bias``; under ``torch.no_grad`` it is the
    pi_old / teacher scoring pass. ``chunk_rows`` fixes the rows per chunk (default:
    ``chunked.chunk_rows_for``, from the shape on CPU, a memory budget elsewhere). The matmul runs in
    ``matmul_dtype``, else the autocast dtype when autocast is on, else the inputs' own dtype
    (``matmul_inputs``); an FSDP2-sharded (DTensor) weight is gathered.
    """
    hidden, weight, *rest = matmul_inputs(hidden, weight, None, bias)
    bias = rest[0] if rest else None
    check_linear_inputs(hidden, weight, targets)
    check_bias(bias, weight, hidden)
    check_temperature(temperature)
    check_logit_head(logit_scale, logit_softcap)
    backend = resolve_backend(backend, hidden.device)
    with torch.autocast(hidden.device.type, enabled=False):
        if backend == "reference":
            check_target_range(targets, weight.shape[0])
            logp, entropy = reference.reference_linear_logprobs(hidden, weight, targets, temperature=temperature,
                                                                bias=bias, logit_scale=logit_scale,
                                                                logit_softcap=logit_softcap)
        else:
            logp, entropy, _ = torch.ops.mopd_kernels.linear_logprobs(
                hidden.contiguous(), weight, targets.contiguous(), float(temperature), backend,
                int(chunk_rows or 0), bool(with_entropy), bias, float(logit_scale), float(logit_softcap or 0.0))
    return logp, (entropy if with_entropy else None)


# ---------------------------------------------------------------------------------------------
# fused_linear_policy_loss: autograd.Function
# ---------------------------------------------------------------------------------------------


class _FusedPolicyLoss(torch.autograd.Function):
    """Forward: loss sum and gradients in one chunked pass. Backward: scale the stored gradients."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, run):
        result = run()
        ctx.grads = (result["grad_hidden"], result["grad_weight"], result["grad_bias"])
        ctx.grad_divisor = result["grad_divisor"]
        ctx.mark_non_differentiable(result["logp"], result["entropy"])
        return result["loss"], result["logp"], result["entropy"]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss, _grad_logp, _grad_entropy):
        if ctx.grads is None:
            raise RuntimeError("fused_linear_policy_loss supports one backward per forward (its gradients "
                               "are computed in the forward and handed over once); run the forward again")
        grads = ctx.grads
        ctx.grads = None
        scale = grad_loss if ctx.grad_divisor is None else grad_loss / ctx.grad_divisor
        # In place: these tensors were made by the forward for this purpose and nothing else holds them.
        for g in grads:
            if g is not None:
                g.mul_(scale.to(g.device))
        return (*grads, None)


def fused_linear_policy_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                             inputs: LossInputs, settings: PolicyLossSettings,
                             normalizer: Union[int, float, torch.Tensor, None] = None,
                             bias: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Stats]:
    """Role-aware clipped PPO / OPD loss of the lm head over packed tokens, without [T, V] logits.

    ``hidden`` [T, H] and ``weight`` [V, H] (the matmul dtype follows ``settings.matmul_dtype`` or
    autocast, ``matmul_inputs``), ``targets`` [T]; ``inputs`` the per-token roles, pi_old / teacher /
    reference log-probs, advantages and optional weights; ``settings`` the hyperparameters.
    ``loss = sum_{t: roles[t] >= 0} loss_t / normalizer`` with the per-token loss of
    ``mopd_kernels.terms`` (advantage by role, the objective's policy term, entropy bonus, KL to
    ``ref_logp``). ``normalizer`` defaults to the number of trained tokens (role >= 0), or 1 when
    ``inputs.weights`` aggregate; pass the global count when a mini-batch is split over ranks or
    accumulation steps. ``bias`` is the lm head's optional ``[V]`` bias (logits ``hidden @ weight.T + bias``).
    Gradients flow to ``hidden``, ``weight`` and ``bias`` only. ``stats[r]`` holds 0-d
    fp32 tensors (no host sync) for every role ``r``, named by ``terms.STAT_NAMES``.
    """
    require_settings(settings)
    if not isinstance(inputs, LossInputs):
        raise ValueError(f"inputs must be a LossInputs, got {type(inputs).__name__}")
    hidden, weight, *rest = matmul_inputs(hidden, weight, settings.matmul_dtype, bias)
    bias = rest[0] if rest else None
    check_loss_inputs(hidden, weight, targets, inputs, settings, normalizer)
    check_bias(bias, weight, hidden)
    backend = resolve_backend(settings.backend, hidden.device)
    with torch.autocast(hidden.device.type, enabled=False):
        if backend == "reference":
            return reference.reference_policy_loss(hidden, weight, targets, inputs, settings, normalizer, bias=bias)
        return _fused_loss(hidden, (weight, bias), targets, inputs, settings, normalizer, backend)


def _fused_loss(hidden, head, targets, inputs: LossInputs, settings: PolicyLossSettings, normalizer,
                backend: str) -> Tuple[torch.Tensor, Stats]:
    """``fused_linear_policy_loss`` after its checks, with autocast off, on a chunked backend
    (``head``: the lm head's weight and bias, None without one)."""
    weight, bias = head
    kernel_inputs = inputs.for_kernels()
    if normalizer is None and inputs.weights is not None:
        normalizer = 1.0  # the weights aggregate
    grad_on = torch.is_grad_enabled()
    # A number normaliser is folded into the gradient matmuls; a tensor one (e.g. an all-reduced
    # count) divides the upstream gradient in backward, so no host sync is needed for it.
    tensor_norm = isinstance(normalizer, torch.Tensor)
    grads = chunked.GradRequest(
        hidden=grad_on and hidden.requires_grad, weight=grad_on and weight.requires_grad,
        scale=1.0 if tensor_norm else (None if normalizer is None else 1.0 / float(normalizer)),
        bias=grad_on and bias is not None and bias.requires_grad)

    def run():
        p = chunked.policy_loss_pass(hidden.detach().contiguous(), weight.detach(), targets.contiguous(),
                                     kernel_inputs, settings, row_pass_for(backend), grads,
                                     None if bias is None else bias.detach())
        trained = kernel_inputs.select(p.index)
        terms = token_terms(p.logp, p.entropy, trained, settings, need_grad=False)
        if tensor_norm:
            divisor = normalizer.to(device=hidden.device, dtype=torch.float32).reshape(())
            grad_divisor = divisor
        else:
            divisor = float(normalizer) if normalizer is not None else float(max(p.logp.numel(), 1))
            grad_divisor = None
        stats = role_stats(terms, p.logp, p.entropy, trained, settings.n_roles, divisor)
        return {"loss": terms["loss"].sum() / divisor, "logp": p.logp, "entropy": p.entropy,
                "grad_hidden": p.grad_hidden, "grad_weight": p.grad_weight, "grad_bias": p.grad_bias,
                "grad_divisor": grad_divisor,
                "stats": stats}

    holder = {}

    def run_and_keep():
        holder.update(run())
        return holder

    if grads.any:
        loss, _, _ = _FusedPolicyLoss.apply(hidden, weight, bias, run_and_keep)
    else:
        loss = run_and_keep()["loss"]
    return loss, holder["stats"]


class FusedLinearPolicyLoss(torch.nn.Module):
    """``fused_linear_policy_loss`` as a module: hyperparameters in ``__init__``, tensors in ``forward``.

    ``loss_fn = FusedLinearPolicyLoss(PolicyLossSettings(role_specs, clip_high=0.28, temperature=0.6))``
    then ``loss, stats = loss_fn(hidden, weight, targets, inputs, normalizer)``. It holds no
    parameters or buffers (the lm-head weight is an argument), so it can sit inside or outside a
    sharded model.
    """

    def __init__(self, settings: PolicyLossSettings):
        super().__init__()
        self.settings = require_settings(settings)

    def forward(self, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, inputs: LossInputs,
                normalizer: Union[int, float, torch.Tensor, None] = None,
                bias: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Stats]:
        return fused_linear_policy_loss(hidden, weight, targets, inputs, self.settings, normalizer, bias)

    def extra_repr(self) -> str:
        return repr(self.settings)
