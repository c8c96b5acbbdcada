"""Where an export may write: never over something the user did not ask to replace.

An export writes into a new or empty directory, or replaces an earlier export **of the same run**,
recognised by the marker file every export writes (``mopd_export.json``: the run it came from and
the checkpoint). Anything else is refused with one line before a model loads: a file, a path under
a file, a directory holding other files (the user's notes, results), a training run directory,
the run's own directory or its run files, an export of another run.

An export is written into a hidden sibling and then put in place by :func:`install_export`;
whatever an interrupted export left beside the target is put back or removed by
:func:`repair_export`, which every export runs first (and ``mopd export --repair``).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import tempfile
from pathlib import Path

from mopd.core.model_dir import is_run_directory
from mopd.core.out_path import out_dir_problem
from mopd.train.run_dir import RUN_ENTRIES

EXPORT_MARKER = "mopd_export.json"


class ExportTargetError(ValueError):
    """The export's output directory holds something it must not replace."""


def run_of(checkpoint_or_run: str | os.PathLike) -> Path:
    """The run directory of a run directory or of one of its ``checkpoints/step_N`` directories."""
    p = Path(checkpoint_or_run)
    return p.parent.parent if p.parent.name == "checkpoints" else p


def marker(run_dir: str | os.PathLike, checkpoint: str, step) -> dict:
    """What an export records about its source (written first into the export)."""
    return {"run": str(Path(run_dir).resolve()), "checkpoint": checkpoint, "step": step}


def _inside(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


def check_export_target(out_dir: str | os.PathLike, run_dir: str | os.PathLike, flag: str = "--out") -> None:
    """Raise :class:`ExportTargetError` unless an export of ``run_dir`` may write ``out_dir``."""
    out, run = Path(out_dir), Path(run_dir)
    problem = out_dir_problem(out)
    if problem:
        raise ExportTargetError(f"{flag} {out} {problem}")
    o, r = out.resolve(), run.resolve()
    if o == r:
        raise ExportTargetError(f"{flag} {out} is the run directory itself: an export never replaces a run; "
                                "export to a new directory")
    if _inside(r, o):
        raise ExportTargetError(f"{flag} {out} holds the run {run}: export to a new directory")
    if _inside(o, r) and o.relative_to(r).parts[0] in RUN_ENTRIES:
        raise ExportTargetError(f"{flag} {out} is inside the run's own files ({o.relative_to(r).parts[0]}); "
                                "export to a new directory")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if is_run_directory(out):
        raise ExportTargetError(f"{flag} {out} is a training run directory; an export never replaces a run")
    m = out / EXPORT_MARKER
    if not m.is_file():
        raise ExportTargetError(f"{flag} {out} is not empty and is not an earlier export of this run (no "
                                f"{EXPORT_MARKER}); its files stay: export to a new or empty directory")
    try:
        source = json.loads(m.read_text(encoding="utf-8")).get("run")
    except (ValueError, OSError, AttributeError):
        source = None
    if source != str(r):
        raise ExportTargetError(f"{flag} {out} holds an export of another run ({source}); export to a new "
                                "directory or remove it yourself")


# ---------------------------------------------------------------------- putting an export in place
NEW_PREFIX = ".{name}.export-"
"""The hidden sibling a new export is written into (its marker first), then moved to the target."""
OLD_PREFIX = ".{name}.export-old-"
"""The hidden sibling where an earlier export waits while the new one is renamed in (where the
filesystem cannot exchange two directories in one step)."""


def _hidden(out: Path, prefix: str) -> list:
    return sorted(out.parent.glob(prefix.format(name=out.name) + "*")) if out.parent.is_dir() else []


def _ours(d: Path) -> bool:
    """An export directory (its marker) or an empty one that an export created."""
    return d.is_dir() and ((d / EXPORT_MARKER).is_file() or not any(d.iterdir()))


def repair_export(out_dir: str | os.PathLike) -> list:
    """Undo what an interrupted export of ``out_dir`` left beside it; returns a line for each thing done.

    An earlier export moved aside (``.NAME.export-old-*/old``) goes back to the target when the
    target is missing (a kill between the two renames); every other hidden sibling that is an
    export (its marker) or empty (an unfinished new export, the old copy after an exchange) is
    removed. Anything else under those names is left and named: it is not an export's."""
    out = Path(out_dir)
    lines = []
    for aside in _hidden(out, OLD_PREFIX):
        old = aside / "old"
        if old.is_dir() and not out.exists() and (old / EXPORT_MARKER).is_file():
            os.replace(old, out)
            lines.append(f"restored {out}: the earlier export, moved aside by an export that was interrupted")
        if not aside.is_dir():
            continue
        if [p.name for p in aside.iterdir()] in ([], ["old"]) and (not old.exists() or _ours(old)):
            shutil.rmtree(aside)
            lines.append(f"removed {aside} (left by an interrupted export)")
        else:
            lines.append(f"left {aside}: it holds files that are not an export's")
    old_names = {p.name for p in _hidden(out, OLD_PREFIX)}
    for tmp in _hidden(out, NEW_PREFIX):
        if tmp.name in old_names or not tmp.is_dir():
            continue
        if _ours(tmp):
            shutil.rmtree(tmp)
            lines.append(f"removed {tmp} (an unfinished export, or the copy an export replaced)")
        else:
            lines.append(f"left {tmp}: it holds files that are not an export's")
    return lines


def install_export(tmp: str | os.PathLike, out_dir: str | os.PathLike) -> None:
    """Put the complete export ``tmp`` at ``out_dir``, replacing what is there (checked by the caller).

    Where the filesystem can exchange two directories in one step (Linux ``renameat2`` with
    ``RENAME_EXCHANGE``), it does: the target holds the old or the new export at every instant,
    and ``tmp`` then holds the old one, deleted last. Elsewhere the old export is renamed into a
    hidden ``.NAME.export-old-*`` folder first and the new one renamed in; an exception between
    the two puts the old one back, and a kill there leaves what :func:`repair_export` (run by the
    next export, or ``mopd export --repair``) puts back."""
    tmp, out = Path(tmp), Path(out_dir)
    if out.exists() and _exchange(tmp, out):
        shutil.rmtree(tmp, ignore_errors=True)
        return
    aside = None
    if out.exists():
        aside = Path(tempfile.mkdtemp(prefix=OLD_PREFIX.format(name=out.name), dir=out.parent))
        os.replace(out, aside / "old")
    try:
        os.replace(tmp, out)
    except BaseException:
        if aside is not None and not out.exists():
            os.replace(aside / "old", out)
        raise
    finally:
        if aside is not None and out.exists():   # the new export, or the old one put back
            shutil.rmtree(aside, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories atomically (Linux renameat2 RENAME_EXCHANGE); False where the C
    library or the filesystem has no such call."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    renameat2.restype = ctypes.c_int
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))
