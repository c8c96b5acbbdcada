"""Atomic, verified, resumable checkpoints (torch.distributed.checkpoint) and Hugging Face export.

A checkpoint is ``<run>/checkpoints/step_<N>/``: the DCP shards of model and optimizer (each
rank writes its own), ``trainer_state.json`` (step, data position, scheduler, bad-step counter),
``rng_rank<r>.pt`` (every rank's torch/numpy/python RNG states) and, written last,
``manifest.json`` (size and sha256 of every other file, :mod:`mopd.train.manifest`).

Saving writes ``step_<N>.tmp`` and renames it only when complete. Re-saving an existing step
first renames the old directory to ``step_<N>.replaced`` and deletes it only after the new one is
in place, so at every instant one complete copy exists (a leftover ``.replaced`` is put back by
the next save or load). Retention keeps the last ``keep`` checkpoints plus the best-validation one
named in ``checkpoints/best.json``.

Loading verifies the manifest and falls back to the newest checkpoint that verifies, reporting
why each newer one was skipped (a truncated, deleted or bit-flipped file, a save that never
finished).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from mopd.core.atomic import atomic_write_text
from mopd.train.manifest import FORMAT, verify_checkpoint, write_manifest

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


class CheckpointError(RuntimeError):
    """No checkpoint of a run can be used (each one's reason is in the message)."""


def save_checkpoint(run_dir: str | os.PathLike, step: int, model, optimizer, trainer_state: dict,
                    keep: int = 3) -> Path:
    """Write step ``step`` atomically, with its manifest; returns the final directory.

    Retention then deletes all but the last ``keep`` checkpoints and the best one (``best.json``)."""
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{step:06d}"
    tmp = root / f"step_{step:06d}.tmp"
    if _rank() == 0:
        recover_replaced(run_dir)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    _barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
    torch.save(rng_state(), tmp / f"rng_rank{_rank()}.pt")
    if _rank() == 0:
        (tmp / "trainer_state.json").write_text(json.dumps({"step": step, "format": FORMAT, **trainer_state},
                                                           indent=2))
    _barrier()
    write_manifest(tmp)
    _barrier()
    if _rank() == 0:
        aside = root / f"step_{step:06d}.replaced"
        if final.exists():
            if aside.exists():
                shutil.rmtree(aside)
            os.replace(final, aside)     # the old copy stays until the new one is in place
        os.replace(tmp, final)
        if aside.exists():
            shutil.rmtree(aside)
        best = best_checkpoint(run_dir)
        for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
            if old != best:
                shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return final


def recover_replaced(run_dir: str | os.PathLike) -> None:
    """Undo a re-save that was killed between its two renames (rank 0 only)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return
    for aside in root.glob("step_*.replaced"):
        final = aside.with_suffix("")
        if final.exists():
            shutil.rmtree(aside, ignore_errors=True)   # the new copy was already in place
        else:
            os.replace(aside, final)


def list_checkpoints(run_dir: str | os.PathLike) -> list:
    """Step directories of a run, oldest first (complete or not: see :func:`find_checkpoint`)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The newest checkpoint that verifies (``None`` if there is none)."""
    return find_checkpoint(run_dir)[0]


def verify_on_all_ranks(path: Path) -> str | None:
    """:func:`verify_checkpoint` with the checksums split over the ranks; every rank gets the same
    answer (a collective under torch.distributed)."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    reason = verify_checkpoint(path, share=(rank, world))
    if world > 1:
        reasons: list = [None] * world
        dist.all_gather_object(reasons, reason)
        reason = next((r for r in reasons if r is not None), None)
    return reason


def find_checkpoint(run_dir: str | os.PathLike) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest verified checkpoint of a run and the ``(path, reason)`` of each newer one skipped.

    All ranks take part (each checksums its share of the files) and reach the same answer."""
    if _rank() == 0:
        recover_replaced(run_dir)
    _barrier()
    skipped = []
    for path in reversed(list_checkpoints(run_dir)):
        reason = verify_on_all_ranks(path)
        if reason is None:
            return path, skipped
        skipped.append((path, reason))
    return None, skipped


def load_checkpoint(path: str | os.PathLike, model, optimizer, verify: bool = True) -> dict:
    """Restore model, optimizer and this rank's RNG; returns the trainer state (step, data, ...)."""
    path = Path(path)
    if verify:
        reason = verify_on_all_ranks(path)
        if reason is not None:
            raise CheckpointError(f"{path} cannot be used: {reason}")
    state_file = path / "trainer_state.json"
    if not state_file.is_file():
        raise CheckpointError(f"{path} is not a complete checkpoint (no trainer_state.json)")
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    rng_file = path / f"rng_rank{_rank()}.pt"
    if rng_file.is_file():
        set_rng_state(torch.load(rng_file, weights_only=False))
    return json.loads(state_file.read_text())


def load_model_weights(path: str | os.PathLike, model) -> None:
    """Load only the model weights of the checkpoint at ``path`` (verified) into ``model``, sharded
    or not; every rank calls it (how a trainer exports its best-validation checkpoint)."""
    path = Path(path)
    reason = verify_on_all_ranks(path)
    if reason is not None:
        raise CheckpointError(f"{path} cannot be used: {reason}")
    state = {"model": get_model_state_dict(model)}
    dcp.load(state, checkpoint_id=str(path))
    set_model_state_dict(model, state["model"])


def load_latest(run_dir: str | os.PathLike, model, optimizer,
                on_skip: Callable[[Path, str], None] = lambda p, why: None) -> tuple[Path | None, dict | None]:
    """Load the newest checkpoint that verifies; ``on_skip(path, reason)`` for every newer one.

    Returns ``(None, None)`` when the run has no checkpoint at all, and raises
    :class:`CheckpointError` when it has some but none verifies (resuming from step 0 would then
    silently throw a run away)."""
    path, skipped = find_checkpoint(run_dir)
    for p, why in skipped:
        on_skip(p, why)
    if path is None:
        if skipped:
            raise CheckpointError(f"no checkpoint of {run_dir} verifies: "
                                  + "; ".join(f"{p.name}: {why}" for p, why in skipped))
        return None, None
    return path, load_checkpoint(path, model, optimizer, verify=False)


# ---------------------------------------------------------------------- the best-validation checkpoint
BEST_FILE = "best.json"


def read_best(run_dir: str | os.PathLike) -> dict | None:
    """``{"step", "metric", "value"}`` of the best-validation checkpoint, if one was marked."""
    f = Path(run_dir) / "checkpoints" / BEST_FILE
    try:
        return json.loads(f.read_text()) if f.is_file() else None
    except ValueError:
        return None


def best_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    b = read_best(run_dir)
    return Path(run_dir) / "checkpoints" / f"step_{int(b['step']):06d}" if b else None


def is_new_best(run_dir: str | os.PathLike, value: float, higher_is_better: bool = True) -> bool:
    b = read_best(run_dir)
    if b is None:
        return True
    return value > b["value"] if higher_is_better else value < b["value"]


def mark_best(run_dir: str | os.PathLike, step: int, metric: str, value: float) -> Path:
    """Record ``step`` (already saved) as the best-validation checkpoint, which retention keeps
    beside the last K (rank 0 writes; call it on every rank)."""
    f = Path(run_dir) / "checkpoints" / BEST_FILE
    if _rank() == 0:
        atomic_write_text(f, json.dumps({"step": int(step), "metric": metric, "value": float(value)}))
    _barrier()
    return f.parent / f"step_{int(step):06d}"


def select_checkpoint(path: str | os.PathLike, which: str = "latest") -> tuple[Path, list[str]]:
    """The checkpoint ``mopd export`` should read, and notes on what was skipped.

    ``path``: a step directory (used as is, if it verifies) or a run directory, where ``which`` is
    ``latest`` (the newest that verifies), ``best`` (the best-validation one) or a step number."""
    path = Path(path)
    if not (path / "checkpoints").is_dir():
        if which != "latest":
            raise CheckpointError(f"--checkpoint {which} needs a run directory; {path} has no checkpoints/")
        reason = verify_checkpoint(path)
        if reason is not None:
            raise CheckpointError(f"{path} cannot be used: {reason}")
        return path, []
    if which == "latest":
        found, skipped = find_checkpoint(path)
        if found is None:
            raise CheckpointError(f"{path} holds no checkpoint that verifies"
                                  + "".join(f"; {p.name}: {why}" for p, why in skipped))
        return found, [f"skipped {p.name}: {why}" for p, why in skipped]
    if which == "best":
        found = best_checkpoint(path)
        if found is None:
            raise CheckpointError(f"{path} has no best-validation checkpoint (checkpoints/{BEST_FILE}: the run "
                                  "never validated, or ran without checkpoints)")
    elif which.isdigit():
        found = path / "checkpoints" / f"step_{int(which):06d}"
    else:
        raise CheckpointError(f"--checkpoint {which!r}: expected latest, best or a step number")
    reason = verify_checkpoint(found)
    if reason is not None:
        raise CheckpointError(f"{found} cannot be used: {reason}")
    return found, []


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
                      base_model_path: str | None = None, which: str = "latest",
                      log: Callable[[str], None] = lambda s: None) -> Path:
    """`mopd export`: load a DCP checkpoint's weights into the base architecture and save it for HF/vLLM.

    ``ckpt_dir`` is a step directory or a run directory (``which``: latest, best or a step number,
    see :func:`select_checkpoint`); the checkpoint must verify against its manifest. The
    architecture and tokenizer come from ``base_model_path``, by default the ``model_path`` the
    run recorded in the checkpoint's trainer_state.json.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ckpt, notes = select_checkpoint(ckpt_dir, which)
    for n in notes:
        log(n)
    log(f"exporting {ckpt}")
    base_model_path = base_model_path or json.loads((ckpt / "trainer_state.json").read_text()).get("model_path")
    if not base_model_path:
        raise CheckpointError(f"{ckpt} does not record its base model; pass --base-model DIR")
    model = AutoModelForCausalLM.from_pretrained(base_model_path, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(base_model_path)
    sd = get_model_state_dict(model)
    state = {"model": sd}
    dcp.load(state, checkpoint_id=str(ckpt))
    model.load_state_dict(state["model"])
    return export_hf(model, tok, out_dir)
