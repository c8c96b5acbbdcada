"""Atomic file writes: a reader sees the old file or the whole new one, never a torn one.

Every writer here writes a temporary file beside the target (same directory, so the rename never
crosses file systems; named with the process id, so two processes never share one), optionally
fsyncs it, and renames it over the target with ``os.replace``. When the writer fails, the
temporary file is removed and the target is left as it was.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator


def temporary_path(path: str | os.PathLike) -> Path:
    """Where a write of ``path`` goes before it is renamed into place."""
    p = Path(path)
    return p.with_name(f"{p.name}.tmp{os.getpid()}")


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", *, encoding: str | None = "utf-8",
                fsync: bool = False) -> Iterator[IO]:
    """``open`` for writing whose result replaces ``path`` only when the block ends without error
    (``fsync``: flushed to the disk first, for files a crash must not lose)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes a whole file: mode 'w' or 'wb', not {mode!r}")
    p = Path(path)
    tmp = temporary_path(p)
    try:
        with open(tmp, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str, *, fsync: bool = False) -> Path:
    with atomic_open(path, "w", fsync=fsync) as f:
        f.write(text)
    return Path(path)


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, fsync: bool = False) -> Path:
    with atomic_open(path, "wb", fsync=fsync) as f:
        f.write(data)
    return Path(path)


def atomic_write_json(path: str | os.PathLike, obj, *, indent: int | None = 2, fsync: bool = False,
                      **dumps) -> Path:
    """``obj`` as JSON (with a final newline) into ``path``; ``dumps``: more ``json.dumps`` options."""
    return atomic_write_text(path, json.dumps(obj, indent=indent, **dumps) + "\n", fsync=fsync)
