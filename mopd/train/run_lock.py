"""The run lock of ``mopd train`` and ``mopd export``: :mod:`mopd.core.run_lock` (evaluation takes it too)."""

from mopd.core.run_lock import LOCK_FILE, RunLock, RunLocked

__all__ = ["LOCK_FILE", "RunLock", "RunLocked"]
