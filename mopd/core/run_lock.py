"""One writer per run directory: an advisory lock held for the whole of a command.

``mopd train`` (fresh or ``--resume``) and ``mopd export`` of a run, and ``mopd eval run`` on its
``--out``, take an exclusive ``fcntl.flock`` on ``<dir>/.mopd.lock`` and keep it until the
process ends. The kernel drops
the lock when the process exits or is killed (even by SIGKILL), so a crashed run never leaves a
stale lock behind; the PID written into the file only names the holder in the refusal. Without
it two ``--resume`` of one run both continue from the same checkpoint, interleave their
``metrics.jsonl`` lines and race on the checkpoint renames; an export could read a checkpoint
that the run's retention is deleting; two evaluations into one ``--out`` both append every
workflow's record. It lives in ``mopd.core`` because training and evaluation both take it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_FILE = ".mopd.lock"


class RunLocked(RuntimeError):
    """Another process holds the run directory (the message names its PID)."""


class RunLock:
    """The held lock of one run directory (``release`` or process exit frees it)."""

    def __init__(self, run_dir: str | os.PathLike, purpose: str):
        self.path = Path(run_dir) / LOCK_FILE
        self._made_dir = not self.path.parent.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a+", encoding="utf-8")
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            holder = self._file.read().strip() or "a process that did not say its PID"
            self._file.close()
            raise RunLocked(f"{Path(run_dir)} is in use by {holder}: one process writes a run at a time; wait "
                            "for it to end or stop it") from None
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"pid {os.getpid()} ({purpose})\n")
        self._file.flush()

    def release(self, discard_if_alone: bool = False) -> None:
        """Drop the lock. ``discard_if_alone``: a directory that this lock created and that holds
        nothing but the lock file is removed too (a command refused before it wrote anything)."""
        if self._file.closed:
            return
        if discard_if_alone and self._made_dir and [p.name for p in self.path.parent.iterdir()] == [LOCK_FILE]:
            self.path.unlink()
            self.path.parent.rmdir()
        self._file.close()    # closing the descriptor drops the flock

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()
