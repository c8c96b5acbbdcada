"""Room for checkpoints: checked before the first step, and named when a save runs out of it; any
other write failure of a save (a file-size limit, a read-only or failing disk) named the same way.

A checkpoint holds the fp32 master weights and AdamW's two fp32 moments: 12 bytes a parameter,
plus small files (RNG, trainer state, manifest). Before training starts the run directory's file
system must have room for one more; a save that still fills the disk (retention keeps several,
other jobs write too) is reported as "no space left" with the space it needed, rather than as
torch's zip-writer error ("unexpected pos ..."), and the previous checkpoints are untouched (the
save writes into ``step_N.tmp`` and removes it when it fails). Every other write failure of a save
(:func:`write_failure`: ``EFBIG`` under ``ulimit -f`` or a file system's file-size cap, ``EIO``,
``EROFS``, ...) is one line naming the checkpoint and the cause, the previous ones intact alike.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
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


ZIP_WRITER = "inline_container.cc"
"""Where torch's zip writer (torch.save, and DCP's files) raises from when a write fails: its
RuntimeError hides the errno ("unexpected pos ...", "file write failed")."""


def write_failure(e: BaseException) -> str | None:
    """What made a save's write fail, in words, when ``e`` is a write failure: an OSError anywhere
    among its causes (its message, errno name and file), or torch's zip writer failing (which hides
    the errno: a file-size limit named when the process has one, else the writer's message); None
    for anything else (a bug is raised as it is)."""
    causes = list(_causes(e))
    for c in causes:
        if isinstance(c, OSError) and c.errno is not None:
            where = f" ({c.filename})" if c.filename else ""
            return f"{c.strerror or c}{where} [{errno.errorcode.get(c.errno, c.errno)}]{_limit_note(c.errno)}"
    writer = next((c for c in causes if isinstance(c, RuntimeError) and ZIP_WRITER in str(c)), None)
    if writer is None:
        return None
    text = " ".join(str(writer).split())
    limit = _file_size_limit()
    if limit is not None:
        return (f"torch's writer failed ({text}): this process may write files of at most {limit} bytes "
                f"(ulimit -f / RLIMIT_FSIZE), and a checkpoint file is likely larger")
    return f"torch's writer failed ({text}): the disk or its file system refused a write"


def _limit_note(code: int) -> str:
    limit = _file_size_limit() if code == errno.EFBIG else None
    return f": this process may write files of at most {limit} bytes (ulimit -f / RLIMIT_FSIZE)" if limit else ""


def _file_size_limit() -> int | None:
    """The process's file-size limit in bytes (``ulimit -f``), None when there is none."""
    if sys.platform == "win32":
        return None
    import resource

    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if soft == resource.RLIM_INFINITY else int(soft)


def save_failed_message(path, cause: str, previous: str | None) -> str:
    """One line: the checkpoint that could not be written, why, and what the run still has."""
    kept = (f"the previous checkpoint {previous} is intact (--resume continues from it)" if previous else
            "no earlier checkpoint was written (the run starts again from step 0)")
    return f"checkpoint {path} could not be written: {cause}; {kept}"
