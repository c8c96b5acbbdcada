"""Room for checkpoints: checked before the first step, and named when a save runs out of it.

A checkpoint holds the fp32 master weights and AdamW's two fp32 moments: 12 bytes a parameter,
plus small files (RNG, trainer state, manifest). Before training starts the run directory's file
system must have room for one more; a save that still fills the disk (retention keeps several,
other jobs write too) is reported as "no space left" with the space it needed, rather than as
torch's zip-writer error ("unexpected pos ..."), and the previous checkpoints are untouched (the
save writes into ``step_N.tmp`` and removes it when it fails).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

from mopd.core.out_path import nearest_existing

BYTES_PER_STORED = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
CHECKPOINT_BYTES_PER_PARAM = 12
"""fp32 weights + AdamW exp_avg + exp_avg_sq."""
MB = 1 << 20


def checkpoint_bytes(model_path: str) -> int | None:
    """Estimated size of one checkpoint of the local model at ``model_path`` (None for a Hub id)."""
    p = Path(model_path)
    files = list(p.glob("*.safetensors")) + list(p.glob("*.bin")) if p.is_dir() else []
    if not files:
        return None
    try:
        conf = json.loads((p / "config.json").read_text())
        stored = BYTES_PER_STORED.get(str(conf.get("torch_dtype") or conf.get("dtype") or "float32"), 4)
    except (OSError, ValueError, AttributeError):
        stored = 4
    params = sum(f.stat().st_size for f in files) // stored
    return params * CHECKPOINT_BYTES_PER_PARAM + MB


def device_of(path: str | os.PathLike) -> str:
    """The mount point holding ``path`` (what a user sees in ``df``)."""
    p = nearest_existing(Path(path))
    while not os.path.ismount(p) and p != p.parent:
        p = p.parent
    return str(p)


def free_space_problem(run_dir: str | os.PathLike, need: int | None) -> str | None:
    """Why ``run_dir`` cannot take one checkpoint of ``need`` bytes, if it cannot."""
    if not need:
        return None
    free = shutil.disk_usage(nearest_existing(Path(run_dir))).free
    if free >= need:
        return None
    return (f"has {free / MB:.0f} MB free on {device_of(run_dir)}, and one checkpoint needs about "
            f"{need / MB:.0f} MB: free some space or set another trainer.out_dir")


def _causes(e: BaseException):
    """``e``, the exceptions it was raised from, and those torch.distributed.checkpoint wrapped
    (its CheckpointException carries each rank's error in ``failures``)."""
    todo, seen = [e], set()
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        yield x
        todo += [x.__cause__, x.__context__]
        todo += [f[0] for f in (getattr(x, "failures", None) or {}).values() if isinstance(f, tuple) and f]


def is_out_of_space(e: BaseException, run_dir, need: int | None) -> bool:
    """``e`` (from a save) means the disk is full: ENOSPC/EDQUOT anywhere among its causes, or an
    error of torch's zip writer (which hides the errno: "unexpected pos ...") while the disk has
    less than ``need`` left."""
    causes = list(_causes(e))
    if any(isinstance(c, OSError) and c.errno in (errno.ENOSPC, errno.EDQUOT) for c in causes):
        return True
    if need and any(isinstance(c, RuntimeError) for c in causes):
        return shutil.disk_usage(nearest_existing(Path(run_dir))).free < need
    return False


def no_space_message(run_dir, need: int | None, previous: str | None) -> str:
    needed = f"{need / MB:.0f} MB needed" if need else "a checkpoint's worth needed"
    kept = f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint was written"
    return f"no space left on {device_of(run_dir)}: {needed}, {kept}"
