"""SIGTERM handled like Ctrl-C, so a scheduler's stop signal ends a run with a checkpoint.

Slurm, Kubernetes and torchrun send SIGTERM some seconds before they kill a job; Python's default
action for it is to die at once. Inside :func:`sigterm_as_interrupt` a SIGTERM raises
``KeyboardInterrupt`` in the main thread instead, which the training loop already turns into
"write a checkpoint, then stop". torchrun forwards SIGTERM to every worker, so every rank gets its
own KeyboardInterrupt, exactly as with SIGINT. The handler is one-shot: a second SIGTERM (the
scheduler losing patience while the checkpoint is written) gets the previous handler, which by
default ends the process; the checkpoint's manifest, written last, keeps that safe.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def sigterm_as_interrupt(enabled: bool = True) -> Iterator[list]:
    """Within the block, SIGTERM raises ``KeyboardInterrupt`` (once); the previous handler is put
    back on exit. Yields a list that holds the received signal numbers (empty if none came).

    Does nothing outside the main thread (Python only delivers signals there) or when disabled."""
    received: list = []
    if not enabled or not hasattr(signal, "SIGTERM") or threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum, frame):
        received.append(signum)
        signal.signal(signal.SIGTERM, previous)   # one-shot: a second SIGTERM acts as before
        raise KeyboardInterrupt(f"signal {signum} (SIGTERM)")

    signal.signal(signal.SIGTERM, handler)
    try:
        yield received
    finally:
        if signal.getsignal(signal.SIGTERM) is handler:
            signal.signal(signal.SIGTERM, previous)
