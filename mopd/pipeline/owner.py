"""A stage is marked done only by a live owner: the pipeline process that holds its root's lock,
or a worker it spawned.

``run_pipeline`` takes ``ROOT/.mopd.lock`` (:class:`mopd.core.run_lock.RunLock`) and records itself
(:func:`hold`: its PID and the lock's path, in the environment its spawned workers inherit).
Before any stage writes its done-marker, :func:`check_live_owner` asks: is the recorded owner this
process or its parent, and does the lock file still name it as its holder, locked? A worker whose
pipeline was killed (re-parented, its parent's lock dropped by the kernel, or taken by a rerun)
is refused in one line, so no rerun reuses a stage that an orphan finished. Outside a pipeline
(a stage run by hand) there is no owner to check.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from pathlib import Path
from typing import Iterator, Optional

from mopd.core.errors import UserError
from mopd.core.run_lock import RunLock

OWNER_ENV = "MOPD_PIPELINE_OWNER"


class OrphanedStage(UserError):
    """A stage finished after its pipeline was gone (the message names the stage and the pipeline)."""


@contextlib.contextmanager
def hold(lock: RunLock) -> Iterator[None]:
    """While the block runs, this process (holding ``lock``, the pipeline root's) is the owner its
    stages and spawned workers check."""
    before = os.environ.get(OWNER_ENV)
    os.environ[OWNER_ENV] = json.dumps({"pid": os.getpid(), "lock": str(lock.path.resolve())})
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(OWNER_ENV, None)
        else:
            os.environ[OWNER_ENV] = before


def lock_holder(path: Path) -> Optional[int]:
    """The PID that holds the lock file ``path`` (None when no process holds it)."""
    try:
        f = open(path, encoding="utf-8")
    except OSError:
        return None
    with f:
        try:    # a shared lock is granted only when no process holds it exclusively
            fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            m = re.match(r"pid (\d+)", f.read())
            return int(m.group(1)) if m else -1
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        return None


def check_live_owner(stage_key: str) -> None:
    """Refuse (:class:`OrphanedStage`) to mark ``stage_key`` done unless its pipeline is alive and
    holds its lock (see the module); nothing to check outside a pipeline."""
    raw = os.environ.get(OWNER_ENV)
    if not raw:
        return
    owner = json.loads(raw)
    pid, lock = int(owner["pid"]), Path(owner["lock"])
    if pid not in (os.getpid(), os.getppid()):
        raise OrphanedStage(f"stage {stage_key} is not marked done: the pipeline that started it (pid {pid}) is "
                            "gone; its next run builds the stage again (resuming what is resumable)")
    holder = lock_holder(lock)
    if holder != pid:
        raise OrphanedStage(f"stage {stage_key} is not marked done: the pipeline that started it (pid {pid}) no "
                            f"longer holds {lock} ({'no process holds it' if holder is None else f'pid {holder} does'})")
