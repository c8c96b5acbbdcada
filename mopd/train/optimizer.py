"""The trainer's AdamW, with its implementation chosen once, where it is built.

``torch.optim.AdamW`` with its defaults runs, on a CPU, the per-parameter loop: a dozen small
kernels for each of the model's tensors (272 for SmolLM2-135M), each reading the parameter, its
gradient and the two moments again. The fused kernel (``torch._fused_adamw_``, what TRL's
``GRPOTrainer`` runs: ``fused=True``) does the whole update of a (device, dtype) group in one pass.
The implementation, in this order:

- ``fused`` where every trainable parameter is a floating-point tensor on a device torch has the
  fused kernel for (CPU, CUDA, XPU, MPS, HPU in torch 2.13); under FSDP2 the parameters are DTensors
  and ``fused`` is kept where the DTensor path runs the fused op (a one-element probe update on the
  parameters' mesh, before training; torch 2.13 has it);
- else ``foreach``, the multi-tensor path (complex parameters, a DTensor path without the fused
  op, a device without the fused kernel);
- else (a tensor subclass that neither takes) the per-parameter loop.

The fused kernel rounds differently from the loop (the same formula, other operation order): on
fp32 the weights agree to a few ulps per step (``tests/train/test_optimizer.py`` bounds it).

A resume keeps the choice: ``Optimizer.load_state_dict`` replaces each group's hyperparameters by
the saved ones (a checkpoint written before this module says ``fused=None``, which on a CPU is the
loop again), so a post hook sets ``fused``/``foreach`` back and moves a fused group's step counters
to float32 on the parameter's device, where the fused kernel reads them.
"""

from __future__ import annotations

from typing import Iterable, List, Tuple

import torch
from torch import nn

FUSED, FOREACH, FOR_LOOP = "fused", "foreach", "for-loop"


def build_adamw(params: Iterable[torch.Tensor], *, lr: float, weight_decay: float,
                betas: Tuple[float, float] = (0.9, 0.999)) -> torch.optim.AdamW:
    """AdamW over ``params`` (the trainable ones) with the fastest implementation torch has for
    them (:func:`adamw_implementation`); ``optimizer.implementation`` names it."""
    params = list(params)
    impl = adamw_implementation(params)
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas,
                                  **_flags(impl))
    optimizer.implementation = impl
    optimizer.register_load_state_dict_post_hook(_keep_implementation)
    return optimizer


def describe(optimizer: torch.optim.Optimizer) -> str:
    """The run log's line: ``optimizer: AdamW (fused), 272 tensors, 134,515,008 parameters``."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    n = sum(p.numel() for p in params)
    impl = getattr(optimizer, "implementation", "torch's default")
    return f"optimizer: {type(optimizer).__name__} ({impl}), {len(params)} tensors, {n:,} parameters"


def adamw_implementation(params: List[torch.Tensor]) -> str:
    """``fused``, ``foreach`` or ``for-loop``: the first that torch runs on every one of ``params``."""
    from torch.optim.optimizer import _foreach_supported_types, _get_fused_kernels_supported_devices

    if not params:
        return FOR_LOOP
    fused_devices = _get_fused_kernels_supported_devices()
    if all(p.is_floating_point() and p.device.type in fused_devices for p in params):
        dtensors = [p for p in params if _is_dtensor(p)]
        if not dtensors or _fused_runs_on_dtensor(dtensors[0]):
            return FUSED
    # torch defaults to foreach on accelerators only, but its _foreach ops run on a CPU as well
    # (a C++ loop over the tensors: still fewer dispatches than the Python loop)
    if all(type(p) in _foreach_supported_types for p in params):
        return FOREACH
    return FOR_LOOP


def _flags(impl: str) -> dict:
    """AdamW's keyword flags for ``impl`` (both False: the loop, whatever torch's default would be)."""
    return {"fused": impl == FUSED, "foreach": impl == FOREACH}


def _is_dtensor(p: torch.Tensor) -> bool:
    return hasattr(p, "device_mesh") and hasattr(p, "placements")


def _fused_runs_on_dtensor(p: torch.Tensor) -> bool:
    """Whether one fused AdamW update runs on a DTensor of ``p``'s mesh, placements, device and dtype
    (FSDP2's parameters): a one-element-per-rank probe, no collective (``run_check=False``; an
    elementwise op on equal placements needs none)."""
    from torch.distributed.tensor import DTensor

    local = p.to_local()

    def dtensor(value: float) -> torch.Tensor:
        t = torch.full((1,) * max(local.dim(), 1), value, dtype=local.dtype, device=local.device)
        return DTensor.from_local(t, p.device_mesh, p.placements, run_check=False)

    try:
        probe = nn.Parameter(dtensor(1.0))
        probe.grad = dtensor(0.5)
        torch.optim.AdamW([probe], lr=1e-3, fused=True).step()
        return bool(torch.isfinite(probe.to_local()).all())
    except (RuntimeError, NotImplementedError, TypeError, ValueError, AssertionError):
        return False


def _keep_implementation(optimizer: torch.optim.Optimizer) -> None:
    """After ``load_state_dict``: the implementation chosen at build time, not the checkpoint's."""
    impl = getattr(optimizer, "implementation", None)
    if impl is None:
        return
    flags = _flags(impl)
    for group in optimizer.param_groups:
        group.update(flags)
        for p in group["params"]:
            step = optimizer.state.get(p, {}).get("step")
            if impl == FUSED and isinstance(step, torch.Tensor):
                optimizer.state[p]["step"] = step.to(dtype=torch.float32, device=_local_device(p))


def _local_device(p: torch.Tensor) -> torch.device:
    return p.to_local().device if _is_dtensor(p) else p.device
