"""Where an export may write: never over something the user did not ask to replace.

An export writes into a new or empty directory, or replaces an earlier export **of the same run**,
recognised by the marker file every export writes (``mopd_export.json``: the run it came from and
the checkpoint). Anything else is refused with one line before a model loads: a file, a path under
a file, a directory holding other files (the user's notes, results), a training run directory,
the run's own directory or its run files, an export of another run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mopd.core.model_dir import is_run_directory
from mopd.core.out_path import out_dir_problem

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
    from mopd.train.run_dir import RUN_ENTRIES

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
