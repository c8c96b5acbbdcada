"""Atomic, resumable checkpoints (torch.distributed.checkpoint) and Hugging Face export.

A checkpoint is ``<run>/checkpoints/step_<N>/``: the DCP shards of model and optimizer (each
rank writes its own), ``trainer_state.json`` (step, data position, scheduler, bad-step counter)
and ``rng_rank<r>.pt`` (every rank's torch/numpy/python RNG states). It is written into
``step_<N>.tmp`` and renamed only when complete, so a crash never leaves a half checkpoint that
``--resume`` would pick; the oldest ones beyond ``keep`` are deleted afterwards.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_state_dict)

_STEP_DIR = re.compile(r"^step_(\d+)$")


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(s: dict) -> None:
    torch.set_rng_state(s["torch"])
    np.random.set_state(s["numpy"])
    random.setstate(s["python"])
    if s.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def save_checkpoint(run_dir: str | os.PathLike, step: int, model, optimizer, trainer_state: dict,
                    keep: int = 3) -> Path:
    """Write step ``step`` atomically; returns the final directory."""
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{step:06d}"
    tmp = root / f"step_{step:06d}.tmp"
    if _rank() == 0:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    _barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
    torch.save(rng_state(), tmp / f"rng_rank{_rank()}.pt")
    if _rank() == 0:
        (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **trainer_state}, indent=2))
    _barrier()
    if _rank() == 0:
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return final


def list_checkpoints(run_dir: str | os.PathLike) -> list:
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: str | os.PathLike) -> Optional[Path]:
    cks = list_checkpoints(run_dir)
    return cks[-1] if cks else None


def load_checkpoint(path: str | os.PathLike, model, optimizer) -> dict:
    """Restore model, optimizer and this rank's RNG; returns the trainer state (step, data, ...)."""
    path = Path(path)
    state_file = path / "trainer_state.json"
    if not state_file.is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no trainer_state.json)")
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    rng_file = path / f"rng_rank{_rank()}.pt"
    if rng_file.is_file():
        set_rng_state(torch.load(rng_file, weights_only=False))
    return json.loads(state_file.read_text())


def full_model_state_dict(model) -> dict:
    """Full (unsharded) parameters on CPU, on rank 0 (other ranks get an empty dict)."""
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    sd = get_model_state_dict(model, options=opts)
    return sd if _rank() == 0 else {}


def export_hf(model, tokenizer, out_dir: str | os.PathLike) -> Path:
    """Write a Hugging Face model directory (safetensors, config, tokenizer), atomically."""
    out = Path(out_dir)
    sd = full_model_state_dict(model)
    if _rank() == 0:
        tmp = out.with_name(out.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        model.save_pretrained(tmp, state_dict=sd, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    _barrier()
    return out


def export_checkpoint(ckpt_dir: str | os.PathLike, out_dir: str | os.PathLike,
                      base_model_path: Optional[str] = None) -> Path:
    """`mopd export`: load a DCP checkpoint's weights into the base architecture and save it for HF/vLLM.

    The architecture and tokenizer come from ``base_model_path``, by default the ``model_path`` the
    run recorded in the checkpoint's trainer_state.json.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ckpt = Path(ckpt_dir)
    if (ckpt / "checkpoints").is_dir():       # a run directory: take its latest checkpoint
        latest = latest_checkpoint(ckpt)
        if latest is None:
            raise FileNotFoundError(f"{ckpt} holds no complete checkpoint")
        ckpt = latest
    if not (ckpt / "trainer_state.json").is_file():
        raise FileNotFoundError(f"{ckpt} is not a complete checkpoint (no trainer_state.json)")
    base_model_path = base_model_path or json.loads((ckpt / "trainer_state.json").read_text()).get("model_path")
    if not base_model_path:
        raise FileNotFoundError(f"{ckpt} does not record its base model; pass --base-model DIR")
    model = AutoModelForCausalLM.from_pretrained(base_model_path, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(base_model_path)
    sd = get_model_state_dict(model)
    state = {"model": sd}
    dcp.load(state, checkpoint_id=str(ckpt))
    model.load_state_dict(state["model"])
    return export_hf(model, tok, out_dir)
