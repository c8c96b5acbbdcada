"""Atomic, verified, resumable checkpoints (torch.distributed.checkpoint); exports are :mod:`mopd.train.export`.

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
import math
import os
import random
import re
import shutil
import warnings
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
from mopd.train.safe_load import UnsafeCheckpointFile, dcp_load, load_rng_file, read_dcp_metadata

STEP_DIR = re.compile(r"^step_(\d+)$")


TRAINED = StateDictOptions(ignore_frozen_params=True)
"""What a checkpoint holds of the model: its trained parameters. In full fine-tuning that is every
parameter; with LoRA the adapters alone (megabytes: the frozen base is the run's ``model.path``,
checked by fingerprint on resume)."""
TRAINED_LOAD = StateDictOptions(ignore_frozen_params=True, strict=False)
"""Loading those: the frozen parameters the checkpoint leaves out stay as loaded from the base
(the checkpoint's names were compared with the model's first: :func:`checkpoint_mismatch`)."""


def trained_state_dict(model) -> dict:
    """The model's state dict as a checkpoint holds it (:data:`TRAINED`): frozen parameters left out,
    a tied one too (``ignore_frozen_params`` alone keeps a tied, frozen lm head: the embedding, 0.78
    GB in bf16 for Qwen3-4B, in every LoRA checkpoint)."""
    from mopd.train.param_names import engine_name

    sd = get_model_state_dict(model, options=TRAINED)
    frozen = {engine_name(n) for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
    return {k: v for k, v in sd.items() if k not in frozen} if frozen else sd


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def rng_state() -> dict:
    """This process's torch, numpy, python (and CUDA) RNG states as tensors, numbers and strings
    only: what ``torch.load(weights_only=True)`` reads back (:mod:`mopd.train.safe_load`)."""
    _, key, pos, has_gauss, gauss = np.random.get_state()
    version, words, gauss_next = random.getstate()
    return {"torch": torch.get_rng_state(),
            "numpy": {"key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss),
                      "gauss": float(gauss)},
            "python": {"version": int(version), "state": torch.tensor(words, dtype=torch.int64),
                       "gauss_next": gauss_next},
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(s: dict) -> None:
    """Restore :func:`rng_state` (or the pickled tuples of checkpoints written before it)."""
    torch.set_rng_state(s["torch"])
    n = s["numpy"]
    np.random.set_state(("MT19937", n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"])
                        if isinstance(n, dict) else n)
    p = s["python"]
    random.setstate((p["version"], tuple(int(w) for w in p["state"].tolist()), p["gauss_next"])
                    if isinstance(p, dict) else p)
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
    if rank() == 0:
        recover_replaced(run_dir)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    barrier()
    try:
        _, optim_sd = get_state_dict(model, optimizer, options=TRAINED)
        model_sd = trained_state_dict(model)
        with warnings.catch_warnings():
            # a single-process run saves without a process group, which DCP supports and warns about
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
        torch.save(rng_state(), tmp / f"rng_rank{rank()}.pt")
        if rank() == 0:
            (tmp / "trainer_state.json").write_text(json.dumps({"step": step, "format": FORMAT, **trainer_state},
                                                               indent=2))
        barrier()
        write_manifest(tmp)
    except BaseException:
        if rank() == 0:   # a partial save (a full disk, a kill) gives its space back; older steps are untouched
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    barrier()
    if rank() == 0:
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
    barrier()
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
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The newest checkpoint that verifies (``None`` if there is none)."""
    return find_checkpoint(run_dir)[0]


def verify_on_all_ranks(path: Path) -> str | None:
    """:func:`verify_checkpoint` with the checksums split over the ranks; every rank gets the same
    answer (a collective under torch.distributed)."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    reason = verify_checkpoint(path, share=(rank(), world))
    if world > 1:
        reasons: list = [None] * world
        dist.all_gather_object(reasons, reason)
        reason = next((r for r in reasons if r is not None), None)
    return reason


def find_checkpoint(run_dir: str | os.PathLike, model=None) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest usable checkpoint of a run and the ``(path, reason)`` of each newer one skipped.

    Usable: it verifies against its manifest and, given the ``model`` it is to be loaded into, it
    belongs to that model and to this run (:func:`checkpoint_mismatch`). All ranks take part (each
    checksums its share of the files) and reach the same answer."""
    if rank() == 0:
        recover_replaced(run_dir)
    barrier()
    skipped = []
    for path in reversed(list_checkpoints(run_dir)):
        reason = verify_on_all_ranks(path)
        if reason is None and model is not None:
            reason = checkpoint_mismatch(path, model, run_dir)
        if reason is None:
            return path, skipped
        skipped.append((path, reason))
    return None, skipped


def checkpoint_mismatch(path: Path, model, run_dir: str | os.PathLike | None = None) -> str | None:
    """Why the (verified) checkpoint at ``path`` cannot be loaded into ``model`` of this run, if it
    cannot: a parameter of another shape, a missing or extra one (a checkpoint of another model
    size, copied in), or a base model whose fingerprint is not the run's (``run.json``).

    Reads only the DCP metadata and trainer_state.json, before any tensor is loaded (DCP would
    raise "Size mismatch" half way through the load)."""
    try:
        meta = read_dcp_metadata(path).state_dict_metadata
    except UnsafeCheckpointFile as e:   # a pickle that would run code: never run, the checkpoint is skipped
        return str(e)
    except Exception as e:  # noqa: BLE001 (a damaged .metadata pickle: not this model's checkpoint)
        return f"unreadable .metadata ({type(e).__name__})"
    rng_file = path / f"rng_rank{rank()}.pt"
    if rng_file.is_file():
        try:
            load_rng_file(rng_file)
        except UnsafeCheckpointFile as e:
            return str(e)
    saved = {k[len("model."):]: tuple(getattr(v, "size", ())) for k, v in meta.items() if k.startswith("model.")}
    mine = {k: tuple(v.shape) for k, v in trained_state_dict(model).items()}
    lora_saved, lora_mine = any(".lora_" in k for k in saved), any(".lora_" in k for k in mine)
    if lora_saved != lora_mine:
        held = "LoRA adapters only" if lora_saved else "all weights (full fine-tuning)"
        wanted = "LoRA adapters (model.lora.rank > 0)" if lora_mine else "all weights (model.lora.rank=0)"
        return f"it holds {held} but this run trains {wanted}"
    for name, shape in mine.items():
        if name not in saved:
            return f"it has no parameter {name} (a checkpoint of another model)"
        if saved[name] != shape:
            return (f"{name} is {list(saved[name])} in the checkpoint but {list(shape)} in the model "
                    "(a checkpoint of another model size)")
    extra = sorted(set(saved) - set(mine))
    if extra:
        return f"it has parameters the model lacks ({extra[0]}, ...: a checkpoint of another model)"
    return _base_model_mismatch(path, run_dir) if run_dir is not None else None


def _base_model_mismatch(path: Path, run_dir) -> str | None:
    """The checkpoint records the weights fingerprint of its run's base model; it must be one the
    run has had (run.json's, or one an ``--allow-changed`` accepted)."""
    try:
        recorded = json.loads((path / "trainer_state.json").read_text()).get("base_model_weights")
        run = json.loads((Path(run_dir) / "run.json").read_text())
    except (OSError, ValueError, AttributeError):
        return None
    if not recorded or not isinstance(run, dict) or not (run.get("model") or {}).get("weights"):
        return None
    known = {run["model"]["weights"]}
    for change in run.get("changes") or []:
        known.update((change.get("changed") or {}).get("model.weights") or ())
    if recorded not in known:
        return (f"it was trained from another base model (weights {recorded[:12]}, this run's "
                f"{run['model']['weights'][:12]}): not a checkpoint of this run")
    return None


def run_base_model_weights(run_dir: str | os.PathLike) -> str | None:
    """The base model's weights fingerprint that ``run.json`` records (saved into every checkpoint)."""
    try:
        return (json.loads((Path(run_dir) / "run.json").read_text()).get("model") or {}).get("weights")
    except (OSError, ValueError, AttributeError):
        return None


def _require_verified(path: Path) -> None:
    """CheckpointError unless the checkpoint at ``path`` verifies on every rank."""
    reason = verify_on_all_ranks(path)
    if reason is not None:
        raise CheckpointError(f"{path} cannot be used: {reason}")


def load_checkpoint(path: str | os.PathLike, model, optimizer, verify: bool = True) -> dict:
    """Restore model, optimizer and this rank's RNG; returns the trainer state (step, data, ...)."""
    path = Path(path)
    if verify:
        _require_verified(path)
    state_file = path / "trainer_state.json"
    if not state_file.is_file():
        raise CheckpointError(f"{path} is not a complete checkpoint (no trainer_state.json)")
    _, optim_sd = get_state_dict(model, optimizer, options=TRAINED)
    state = {"model": trained_state_dict(model), "optim": optim_sd}
    rng_file = path / f"rng_rank{rank()}.pt"
    try:
        rng = load_rng_file(rng_file) if rng_file.is_file() else None
        dcp_load(state, path)
    except UnsafeCheckpointFile as e:
        raise CheckpointError(str(e)) from None
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=TRAINED_LOAD)
    if rng is not None:
        set_rng_state(rng)
    return json.loads(state_file.read_text())


def load_model_weights(path: str | os.PathLike, model, verify: bool = True) -> None:
    """Load only the model weights of the checkpoint at ``path`` (verified, unless the caller just
    did) into ``model``, sharded or not; every rank calls it (how a trainer exports its
    best-validation checkpoint, and ``mopd export`` any checkpoint)."""
    path = Path(path)
    if verify:
        _require_verified(path)
    state = {"model": trained_state_dict(model)}
    try:
        dcp_load(state, path)
    except UnsafeCheckpointFile as e:
        raise CheckpointError(str(e)) from None
    set_model_state_dict(model, state["model"], options=TRAINED_LOAD)


def load_latest(run_dir: str | os.PathLike, model, optimizer,
                on_skip: Callable[[Path, str], None] = lambda p, why: None) -> tuple[Path | None, dict | None]:
    """Load the newest checkpoint that verifies; ``on_skip(path, reason)`` for every newer one.

    Returns ``(None, None)`` when the run has no checkpoint at all, and raises
    :class:`CheckpointError` when it has some but none verifies (resuming from step 0 would then
    silently throw a run away)."""
    path, skipped = find_checkpoint(run_dir, model)
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
    """``{"step", "metric", "value"}`` of the best-validation checkpoint, if one was marked (a
    malformed ``best.json`` counts as none: :func:`best_problem` says what is wrong with it)."""
    return _parse_best(Path(run_dir) / "checkpoints" / BEST_FILE)[0]


def best_problem(run_dir: str | os.PathLike) -> str | None:
    """Why the run's ``checkpoints/best.json`` cannot be read (None when it is fine or absent)."""
    return _parse_best(Path(run_dir) / "checkpoints" / BEST_FILE)[1]


def _parse_best(f: Path) -> tuple[dict | None, str | None]:
    if not f.exists():
        return None, None
    try:
        b = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:   # a directory, unreadable, not UTF-8, not JSON
        return None, f"{f} is malformed ({type(e).__name__}: {str(e)[:80]})"
    step, value = (b.get("step"), b.get("value")) if isinstance(b, dict) else (None, None)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return None, f"{f} is malformed (no step number: {json.dumps(b)[:80]})"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None, f"{f} is malformed (no finite value: {json.dumps(b)[:80]})"
    return {"step": step, "metric": str(b.get("metric", "")), "value": float(value)}, None


def best_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    b = read_best(run_dir)
    return Path(run_dir) / "checkpoints" / f"step_{b['step']:06d}" if b else None


def is_new_best(run_dir: str | os.PathLike, value: float, higher_is_better: bool = True) -> bool:
    b = read_best(run_dir)
    if b is None:
        return True
    return value > b["value"] if higher_is_better else value < b["value"]


def mark_best(run_dir: str | os.PathLike, step: int, metric: str, value: float) -> Path:
    """Record ``step`` (already saved) as the best-validation checkpoint, which retention keeps
    beside the last K (rank 0 writes; call it on every rank)."""
    f = Path(run_dir) / "checkpoints" / BEST_FILE
    if rank() == 0:
        atomic_write_text(f, json.dumps({"step": int(step), "metric": metric, "value": float(value)}))
    barrier()
    return f.parent / f"step_{int(step):06d}"


def select_checkpoint(path: str | os.PathLike, which: str = "best", model=None) -> tuple[Path, list[str]]:
    """The checkpoint ``mopd export`` should read, and notes on what was skipped or chosen instead.

    ``path``: a step directory (used as is, if it verifies) or a run directory, where ``which`` is
    ``best`` (the best-validation checkpoint, the paper's model selection; the latest when the run
    never validated, as ``mopd train --export`` does), ``latest`` (the newest usable one) or a step
    number. Given ``model``, a checkpoint must also fit it (:func:`checkpoint_mismatch`): a newer one
    that does not is skipped for ``latest``, and refused when named."""
    path = Path(path)

    def usable(found: Path, run_dir) -> str | None:
        reason = verify_checkpoint(found)
        return reason if reason is not None or model is None else checkpoint_mismatch(found, model, run_dir)

    if not (path / "checkpoints").is_dir():
        if which not in ("latest", "best"):
            raise CheckpointError(f"--checkpoint {which} needs a run directory; {path} has no checkpoints/")
        run = path.parent.parent if path.parent.name == "checkpoints" else None
        reason = usable(path, run)
        if reason is not None:
            raise CheckpointError(f"{path} cannot be used: {reason}")
        return path, []
    notes = []
    if which == "best":
        found = best_checkpoint(path)
        if found is None:
            which = "latest"
            problem = best_problem(path)
            notes.append(f"{problem}: treated as no best-validation checkpoint; exporting the latest" if problem else
                         f"{path} has no best-validation checkpoint (the run never validated): exporting the latest")
    if which == "latest":
        found, skipped = find_checkpoint(path, model)
        if found is None:
            raise CheckpointError(f"{path} holds no checkpoint that can be used"
                                  + "".join(f"; {p.name}: {why}" for p, why in skipped))
        return found, notes + [f"skipped {p.name}: {why}; using {found.name}" for p, why in skipped]
    if which.isdigit():
        found = path / "checkpoints" / f"step_{int(which):06d}"
    elif which != "best":
        raise CheckpointError(f"--checkpoint {which!r}: expected best, latest or a step number")
    reason = usable(found, path)
    if reason is not None:
        raise CheckpointError(f"{found} cannot be used: {reason}")
    return found, notes
