"""LoRA: one frozen base, three models (the student, the teacher, the reference) as views of it.

With ``model.lora.rank`` > 0 the policy is the base model with PEFT's LoRA adapters injected into
its projections (``add_adapters``): the base is frozen and held once, in the compute dtype (bf16 on
a GPU), with no fp32 master copy, no gradient and no optimizer state; only the adapters train, in
fp32, with their own AdamW. A frozen model of Stage II that is the same base needs no copy either:

- the **teacher** given as the Stage-I run's adapter (``mopd export --adapter``) is loaded into the
  same modules under its own name (``load_frozen_adapter``) and scores with that adapter alone
  active (``AdapterView``);
- a **reference** (or a base teacher) that is the base itself scores with no adapter active.

Memory plan (Qwen3-4B, rank 16 on all seven projections of the 36 layers): base 7.5 GiB in bf16
once; the adapter 33M parameters, 0.12 GiB in fp32, its gradient and AdamW moments 0.37 GiB more;
a teacher adapter 0.12 GiB. Full fine-tuning holds 15 GiB of fp32 masters, 30 GiB of moments and
two more 7.5 GiB copies for the teacher and the reference (``mopd plan``).

Switching adapters goes through PEFT's public functions (``peft.functional``): ``set_adapter`` with
``inference_mode=True`` for a frozen view, then back to the student's adapter, which restores
exactly which parameters train. The adapter on disk is PEFT's own format (``adapter_config.json``,
``adapter_model.safetensors`` with ``base_model.model.`` names), which ``PeftModel.from_pretrained``
and vLLM's LoRA loader read, plus ``mopd_base.json``: the base it needs, by path and by the
fingerprint of its weights (:mod:`mopd.core.fingerprint`), which a resume or an adapter teacher must
match.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, Optional

import torch
from torch import nn

from mopd.core.adapter_dir import (ADAPTER_CONFIG, ADAPTER_WEIGHTS, BASE_FILE, PEFT_PREFIX, AdapterDirError,
                                   read_adapter_dir)
from mopd.core.run_models import Adapters, RunModelsError, check_targets, structure_of

STUDENT = "default"
"""The name of the adapter being trained (PEFT's default name)."""


class LoraError(RuntimeError):
    """An adapter cannot be added or loaded (the message names the setting or the directory): one
    line (the trainer says it as a ModelLoadError, an export as a CheckpointError)."""


def peft_config(adapters: Adapters, base_path: str = "", *, frozen: bool = False):
    """PEFT's ``LoraConfig`` for the run's adapters (:class:`mopd.core.run_models.Adapters`)."""
    from peft import LoraConfig

    adapters = Adapters.of(adapters)
    return LoraConfig(r=adapters.rank, lora_alpha=adapters.alpha, lora_dropout=0.0 if frozen else adapters.dropout,
                      target_modules=adapters.peft_targets(), bias="none", task_type="CAUSAL_LM",
                      base_model_name_or_path=base_path or None, inference_mode=frozen)


def add_adapters(model: nn.Module, adapters: Adapters, base_path: str = "") -> None:
    """Inject the trainable LoRA adapters into ``model`` in place and freeze everything else.

    The target names are checked against the model's modules first
    (:func:`mopd.core.run_models.check_targets`: a name that matches nothing, a tied embedding, a
    rank over a layer's width are one line). The adapters are created in fp32 whatever the base's
    dtype (PEFT's ``cast_adapter_dtype``): AdamW on bf16 adapters would lose small updates to
    rounding as bf16 masters do. The lm head is never adapted (``model.lora.target_modules``
    refuses it): the fused loss head takes it as one plain, frozen weight, and then skips its
    weight gradient."""
    from peft.functional import cast_adapter_dtype, inject_adapter_in_model

    adapters = Adapters.of(adapters)
    try:
        check_targets(adapters, structure_of(model))
    except RunModelsError as e:
        raise LoraError(str(e)) from None
    model.requires_grad_(False)
    try:
        inject_adapter_in_model(peft_config(adapters, base_path), model, adapter_name=STUDENT)
    except ValueError as e:   # PEFT: "Target modules {...} not found in the base model"
        raise LoraError(f"model.lora.target_modules={','.join(adapters.target_modules)}: {_first_line(e)}") from None
    cast_adapter_dtype(model, STUDENT, autocast_adapter_dtype=True)
    if not any(p.requires_grad for p in model.parameters()):
        raise LoraError("model.lora: no adapter parameter was created (model.lora.target_modules)")


def is_adapted(model: nn.Module) -> bool:
    """Whether ``model`` carries LoRA adapters (``add_adapters``)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return any(isinstance(m, BaseTunerLayer) for m in model.modules())


def is_lora_layer(module: nn.Module) -> bool:
    """Whether ``module`` is one of PEFT's LoRA layers (a base layer with its adapters)."""
    from peft.tuners.lora import LoraLayer

    return isinstance(module, LoraLayer)


def settings_of(model: nn.Module) -> Adapters:
    """The settings (:class:`mopd.core.run_models.Adapters`) of the student's adapter in ``model``,
    read from its LoRA layers (rank, alpha, the adapted modules' names)."""
    layers = [(n, m) for n, m in model.named_modules() if is_lora_layer(m) and STUDENT in m.r]
    if not layers:
        raise LoraError("the model has no LoRA adapter to read")
    _, first = layers[0]
    targets = tuple(sorted({n.rpartition(".")[2] for n, _ in layers}))
    return Adapters(rank=first.r[STUDENT], alpha=float(first.lora_alpha[STUDENT]), dropout=0.0,
                    target_modules=targets)


def adapter_parameter_count(model: nn.Module, name: str = STUDENT) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if _is_adapter_param(n, name))


@contextmanager
def active_adapter(model: nn.Module, name: Optional[str]) -> Iterator[None]:
    """Run ``model`` with the frozen adapter ``name`` alone active (None: the base, no adapter), then
    make the student's adapter active and trainable again, exactly as before."""
    from peft.functional import set_adapter

    set_adapter(model, name if name is not None else [], inference_mode=True)
    try:
        yield
    finally:
        set_adapter(model, STUDENT)


class AdapterView:
    """A frozen model that is the policy's own base with a frozen adapter active, or none: the
    teacher or the reference of a LoRA run, scoring through the policy's module (the same FSDP
    root, so the same collectives on every rank) with no second copy of the base."""

    def __init__(self, policy: nn.Module, adapter: Optional[str], path: str):
        self.policy = policy
        """The trainer's :class:`mopd.train.model.PackedCausalLM` (its ``lm`` carries the adapters)."""
        self.adapter = adapter
        self.path = path
        self.collective = torch.distributed.is_available() and torch.distributed.is_initialized()
        """Scoring runs the policy's (sharded) forward: under a process group a collective."""

    @torch.no_grad()
    def logprobs(self, batch, temperature: float = 1.0) -> torch.Tensor:
        with active_adapter(self.policy.lm, self.adapter):
            return self.policy(batch, temperature=temperature)


def load_frozen_adapter(model: nn.Module, adapter_dir: str, name: str) -> None:
    """Add the adapter saved in ``adapter_dir`` (PEFT's format) to ``model`` under ``name``, frozen,
    in fp32 (as the student's); the student's adapter stays the active, trainable one."""
    from peft.functional import cast_adapter_dtype, inject_adapter_in_model, set_adapter, set_peft_model_state_dict

    adapter = read_adapter_dir(adapter_dir)
    cfg = _peft_config_from_dict(adapter.config, frozen=True)
    try:
        inject_adapter_in_model(cfg, model, adapter_name=name)
    except ValueError as e:
        raise LoraError(f"{adapter_dir}: its target modules do not fit this model: {_first_line(e)}") from None
    state = {k.removeprefix(PEFT_PREFIX): v for k, v in load_adapter_weights(adapter_dir).items()}
    result = set_peft_model_state_dict(model, state, adapter_name=name)
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected:
        raise LoraError(f"{adapter_dir}: {len(unexpected)} adapter tensors match no module of this model "
                        f"({unexpected[0]}, ...): an adapter of another architecture")
    cast_adapter_dtype(model, name, autocast_adapter_dtype=True)
    for n, p in model.named_parameters():
        if _is_adapter_param(n, name):
            p.requires_grad_(False)
    set_adapter(model, STUDENT)


def load_adapter_weights(adapter_dir: str) -> Dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    f = Path(adapter_dir) / ADAPTER_WEIGHTS
    try:
        return load_file(str(f))
    except (OSError, ValueError, RuntimeError) as e:   # safetensors raises its own error for a damaged header
        raise AdapterDirError(f"{adapter_dir}: {ADAPTER_WEIGHTS} cannot be read ({_first_line(e)})") from None


def adapter_state_dict(model: nn.Module, name: str = STUDENT) -> Dict[str, torch.Tensor]:
    """The adapter ``name``'s full tensors on CPU under PEFT's on-disk names
    (``base_model.model.<module>.lora_A.weight``). Under FSDP2 every rank must call it: each
    sharded tensor is gathered (a collective), one at a time."""
    from mopd.train.param_names import engine_name

    state = {}
    for n, p in model.named_parameters():
        if _is_adapter_param(n, name):
            t = p.detach()
            if hasattr(t, "full_tensor"):
                t = t.full_tensor()
            # PEFT's file names: the module path (wrappers' components removed) without the adapter's name
            key = engine_name(n).replace(f".lora_A.{name}.", ".lora_A.").replace(f".lora_B.{name}.", ".lora_B.")
            state[PEFT_PREFIX + key] = t.to("cpu", copy=True).contiguous()
    return state


def write_adapter_dir(out: Path, state: Dict[str, torch.Tensor], adapters: Adapters, base: dict) -> None:
    """Write PEFT's adapter files and ``mopd_base.json`` into the (new, private) directory ``out``.
    ``base``: the base it needs, ``{"path", "weights"}`` (``RunModels.base_record``: resolved, so the
    adapter works from any working directory)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    peft_config(adapters, base.get("path") or "").save_pretrained(str(out))
    (out / BASE_FILE).write_text(json.dumps({"path": base.get("path") or "", "weights": base.get("weights")},
                                            indent=1))


def merged_model(base_path: str, adapters: Adapters, state: Dict[str, torch.Tensor], *, dtype: torch.dtype):
    """The base model at ``base_path`` with the adapter ``state`` (PEFT names) merged into its
    weights: a plain Hugging Face model (CPU) that loads and runs without PEFT. PEFT's
    ``merge_and_unload`` does the merge (W + alpha/r * B A, in the base's dtype)."""
    from peft import get_peft_model, set_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    from mopd.core.model_dir import remote_code_trusted

    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=dtype, trust_remote_code=remote_code_trusted())
    wrapped = get_peft_model(base, peft_config(adapters, base_path))
    result = set_peft_model_state_dict(wrapped, state)
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected:
        raise LoraError(f"the adapter does not fit {base_path} ({unexpected[0]}, ...)")
    return wrapped.merge_and_unload()


def merge_adapter(model: nn.Module, adapter_dir: str) -> nn.Module:
    """``model`` (a loaded base) with the adapter saved in ``adapter_dir`` merged into its weights:
    the same plain model class, no adapter modules left (a frozen teacher given as an adapter to a
    run without LoRA)."""
    from peft import get_peft_model, set_peft_model_state_dict

    adapter = read_adapter_dir(adapter_dir)
    wrapped = get_peft_model(model, _peft_config_from_dict(adapter.config, frozen=True))
    result = set_peft_model_state_dict(wrapped, load_adapter_weights(adapter_dir))
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected:
        raise LoraError(f"{adapter_dir}: {len(unexpected)} adapter tensors match no module of its base "
                        f"({unexpected[0]}, ...)")
    return wrapped.merge_and_unload()


def _is_adapter_param(name: str, adapter: str) -> bool:
    return ".lora_" in name and f".{adapter}." in name + "."


def _peft_config_from_dict(d: dict, *, frozen: bool):
    from peft import LoraConfig

    keep = {k: v for k, v in d.items() if k in LoraConfig.__dataclass_fields__}
    keep.update(inference_mode=frozen, lora_dropout=0.0 if frozen else keep.get("lora_dropout", 0.0))
    return LoraConfig(**keep)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


__all__ = ["ADAPTER_CONFIG", "STUDENT", "AdapterView", "LoraError", "active_adapter", "adapter_parameter_count",
           "adapter_state_dict", "add_adapters", "is_adapted",
           "load_frozen_adapter", "merged_model", "write_adapter_dir"]
