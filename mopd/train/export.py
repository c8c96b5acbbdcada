"""Exports: a run's weights as a Hugging Face model directory, or a LoRA run's adapter alone.

``mopd export RUN`` (:func:`export_checkpoint`) and ``mopd train --export``
(:func:`export_weights`) write a plain Hugging Face model (safetensors, config, tokenizer) that
``from_pretrained`` and vLLM load with no PEFT: a LoRA run's adapter is merged into its base (in
fp32, so that updates smaller than a bf16 rounding step are not lost). On request (``--adapter``) a
LoRA run writes its adapter alone in PEFT's format with the fingerprint of the base it needs
(:mod:`mopd.core.adapter_dir`): what a Stage II over the same base takes as its teacher, with no
second copy of the base in memory.

Every export is written into a fresh hidden sibling of the target and then put in its place
(:func:`install_dir`), so the target always holds a whole export.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Optional

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from transformers import AutoModelForCausalLM, AutoTokenizer

from mopd.core.model_dir import model_dir_problem, remote_code_trusted
from mopd.core.run_models import Adapters, RunModels
from mopd.train import lora as lora_mod
from mopd.train.checkpoint import (STEP_DIR, CheckpointError, barrier, rank,
                                   list_checkpoints, load_model_weights, select_checkpoint)
from mopd.train.export_target import (EXPORT_MARKER, NEW_PREFIX, ExportTargetError, check_export_target,
                                      install_export, marker, repair_export, run_of)


def full_model_state_dict(model) -> dict:
    """Full (unsharded) parameters on CPU, on rank 0 (other ranks get an empty dict)."""
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    sd = get_model_state_dict(model, options=opts)
    return sd if rank() == 0 else {}


def export_hf(model, tokenizer, out_dir: str | os.PathLike, source: dict, state_dict: dict | None = None) -> Path:
    """Write a Hugging Face model directory (safetensors, config, tokenizer) atomically, with the
    export marker ``source`` (:func:`mopd.train.export_target.marker`).

    The caller has checked the target (:func:`mopd.train.export_target.check_export_target`): new,
    empty, or an earlier export of the same run, after :func:`mopd.train.export_target.repair_export`
    put back or removed what an interrupted export left. The model is written into a fresh hidden
    sibling directory (its marker first), which then takes the target's place
    (:func:`mopd.train.export_target.install_export`): at every instant the target holds the
    earlier export or the new one, or, where the filesystem cannot exchange two directories, what
    the next export or ``mopd export --repair`` puts back. ``state_dict``: what to write instead of
    ``model``'s own (gathered) parameters (rank 0's; a LoRA run's merged weights)."""
    sd = full_model_state_dict(model) if state_dict is None else state_dict

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, state_dict=sd, safe_serialization=True)
        tokenizer.save_pretrained(tmp)

    return install_dir(out_dir, source, write)


def export_adapter(state: dict, models: RunModels, out_dir: str | os.PathLike, source: dict) -> Path:
    """Write the adapter ``state`` (PEFT names, :func:`mopd.train.lora.adapter_state_dict`) of a run
    whose models are ``models`` as PEFT's adapter directory, with the base it needs recorded
    resolved (its directory, or a Hub id, and its weights' fingerprint: ``RunModels.base_record``)."""
    return install_dir(out_dir, source, lambda tmp: lora_mod.write_adapter_dir(
        tmp, state, models.adapters, models.base_record))


def install_dir(out_dir: str | os.PathLike, source: dict, write: Callable[[Path], None]) -> Path:
    """Rank 0 writes a fresh hidden sibling of ``out_dir`` (its export marker first, then ``write``)
    and puts it in the target's place (:func:`mopd.train.export_target.install_export`); every rank
    returns after a barrier."""
    out = Path(out_dir)
    if rank() == 0:
        out.parent.mkdir(parents=True, exist_ok=True)
        repair_export(out)
        tmp = Path(tempfile.mkdtemp(prefix=NEW_PREFIX.format(name=out.name), dir=out.parent))
        try:
            (tmp / EXPORT_MARKER).write_text(json.dumps(source, indent=1), encoding="utf-8")
            write(tmp)
            install_export(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    barrier()
    return out


def recorded_states(src: Path):
    """The readable trainer_state.json of a step directory, or of a run's checkpoints newest first."""
    steps = [src] if not (src / "checkpoints").is_dir() else list(reversed(list_checkpoints(src)))
    for step in steps:
        try:
            state = json.loads((step / "trainer_state.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(state, dict):
            yield state


def recorded_base_model(src: Path) -> str | None:
    """The base model a run (or step directory) was trained from: run.json's ``model.path``, else
    the newest readable checkpoint's trainer_state.json."""
    run = run_of(src)
    try:
        path = json.loads((run / "run.json").read_text())["config"]["model.path"]
        if path:
            return path
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return next((s["model_path"] for s in recorded_states(src) if s.get("model_path")), None)


def recorded_adapters(src: Path) -> Optional[Adapters]:
    """The adapters a run (or step directory) trained (None: full fine-tuning): the newest readable
    checkpoint's trainer_state.json, else the settings run.json recorded (a run with no checkpoint)."""
    states = list(recorded_states(src))
    if states:
        return Adapters.from_record(states[0].get("lora"))
    try:
        conf = json.loads((run_of(src) / "run.json").read_text())["config"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(conf, dict):
        return None
    return Adapters.from_record({k.removeprefix("model.lora."): v for k, v in conf.items()
                                 if k.startswith("model.lora.")})


def _check_lora_base(src: Path, models: RunModels) -> None:
    """A LoRA checkpoint merged into (or exported for) a base of other weights than the one it was
    trained over would be garbage that loads: refused in one line (the weights' fingerprints)."""
    recorded = next(iter(recorded_states(src)), {}).get("base_model_weights")
    have = models.base_weights
    if recorded and have and recorded != have:
        raise CheckpointError(f"{src} trained LoRA adapters over another base (weights {recorded[:12]}); "
                              f"{models.base} has {have[:12]}: pass the base it was trained on (--base-model)")


def export_weights(model, tokenizer, out_dir: str | os.PathLike, source: dict, *,
                   models: Optional[RunModels] = None, adapter: bool = False) -> Path:
    """Export ``model`` as it is (every rank calls it): the full weights; in a run that trains
    adapters (``models``, :class:`mopd.core.run_models.RunModels`) the adapter merged into a fresh
    fp32 copy of the base, or the adapter alone when ``adapter``."""
    if models is None or not models.trains_adapters:
        if adapter:
            raise CheckpointError("--adapter: this run trains all weights (no LoRA): there is no adapter to export")
        return export_hf(model, tokenizer, out_dir, source)
    state = lora_mod.adapter_state_dict(model)   # a collective under FSDP: every rank
    if adapter:
        return export_adapter(state, models, out_dir, source)
    merged = lora_mod.merged_model(models.base, models.adapters, state, dtype=torch.float32) if rank() == 0 \
        else model
    return export_hf(merged, tokenizer, out_dir, source, state_dict=merged.state_dict() if rank() == 0 else {})


def export_checkpoint(ckpt_dir: str | os.PathLike, out_dir: str | os.PathLike,
                      base_model_path: str | None = None, which: str = "best",
                      log: Callable[[str], None] = lambda s: None, adapter: bool = False) -> Path:
    """`mopd export`: load a DCP checkpoint's weights into the base architecture and save it for HF/vLLM.

    ``ckpt_dir`` is a step directory or a run directory (``which``: best, latest or a step number,
    see :func:`select_checkpoint`); the checkpoint must verify against its manifest and fit the
    base model. The architecture and tokenizer come from ``base_model_path``, by default the
    model the run recorded (:func:`recorded_base_model`). A LoRA run's checkpoint (adapters only)
    is exported merged into that base, or as the adapter alone with ``adapter``; the base must be
    the one the run trained over (its fingerprint). ``out_dir`` is checked first
    (:func:`mopd.train.export_target.check_export_target`): nothing loads if it cannot be written.
    """
    src = Path(ckpt_dir)
    if not src.is_dir():
        raise CheckpointError(f"{src} does not exist (expected a run directory or RUN/checkpoints/step_N)")
    run = run_of(src)
    try:
        for line in repair_export(out_dir):   # before the check: the target may be an interrupted export's
            log(line)
        check_export_target(out_dir, run)
    except ExportTargetError as e:
        raise CheckpointError(str(e)) from None
    except OSError as e:
        raise CheckpointError(f"--out {out_dir}: what an interrupted export left cannot be repaired: {e}") from None
    base_model_path = base_model_path or recorded_base_model(src)
    if not base_model_path:
        raise CheckpointError(f"{src} does not record its base model; pass --base-model DIR")
    if Path(base_model_path).is_dir() and model_dir_problem(base_model_path):
        raise CheckpointError(f"base model {base_model_path} {model_dir_problem(base_model_path)}")
    adapters = recorded_adapters(src)
    if adapter and adapters is None:
        raise CheckpointError(f"--adapter: {src} trained all weights (no LoRA): there is no adapter to export")
    if not list_checkpoints(run) and not STEP_DIR.match(src.name):
        raise CheckpointError(f"{src} has no checkpoint yet (it saves every trainer.checkpoint_every steps and at "
                              "its end): nothing to export")
    models = RunModels(base_model_path, adapters, ())
    trusted = remote_code_trusted()
    try:
        model = AutoModelForCausalLM.from_pretrained(base_model_path, dtype=torch.float32, trust_remote_code=trusted)
        tok = AutoTokenizer.from_pretrained(base_model_path, trust_remote_code=trusted)
    except (OSError, ValueError) as e:   # not a directory, not in the Hub cache (the Hub is not asked offline)
        raise CheckpointError(f"base model {base_model_path} cannot be loaded: {str(e).splitlines()[0][:200]}") from None
    if adapters is not None:
        _check_lora_base(src, models)
        try:
            lora_mod.add_adapters(model, adapters, base_model_path)
        except lora_mod.LoraError as e:
            raise CheckpointError(f"{src}: {e}") from None
    ckpt, notes = select_checkpoint(src, which, model=model)
    for n in notes:
        log(n)
    log(f"exporting {ckpt}")
    load_model_weights(ckpt, model, verify=False)   # select_checkpoint verified it
    step = STEP_DIR.match(ckpt.name)
    source = marker(run, str(ckpt.resolve()), int(step.group(1)) if step else None)
    if adapters is None:
        return export_hf(model, tok, out_dir, source)
    state = lora_mod.adapter_state_dict(model)
    if adapter:
        return export_adapter(state, models, out_dir, source)
    del model
    merged = lora_mod.merged_model(base_model_path, adapters, state, dtype=torch.float32)
    return export_hf(merged, tok, out_dir, source)
