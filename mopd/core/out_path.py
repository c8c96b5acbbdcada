"""Can a command write its output directory? Checked before any work starts, as one line.

``mkdir`` on a path that is a file, or under one, raises ``NotADirectoryError`` or
``FileExistsError``, and a read-only directory raises ``OSError`` at the first write: after a
model has loaded, or after a training step. These checks look at the path and its nearest
existing ancestor only; they write nothing.
"""

from __future__ import annotations

import os
from pathlib import Path


def nearest_existing(path: Path) -> Path:
    """``path`` itself if it exists, else its closest ancestor that does."""
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def out_dir_problem(path: str | os.PathLike, inner: tuple = ()) -> str | None:
    """``None`` if ``path`` is, or can be created as, a writable directory (and so are those of its
    ``inner`` subdirectories that exist); else why not (the end of a sentence that starts with the path)."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        return "is a file, not a directory"
    base = nearest_existing(p)
    if not base.is_dir():
        return f"is under {base}, which is a file"
    for d in (base, *(p / name for name in inner if (p / name).is_dir())):
        if not os.access(d, os.W_OK | os.X_OK):
            return f"cannot be written: {d} is read-only"
    return None
