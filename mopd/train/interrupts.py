"""SIGTERM handled like Ctrl-C, so a scheduler's stop signal ends a run with a checkpoint.

The trainer uses :class:`StopSignals` (both signals, with sections that a signal does not cut);
:func:`sigterm_as_interrupt` is the plain form for other loops.

Slurm, Kubernetes and torchrun send SIGTERM some seconds before they kill a job; Python's default
action for it is to die at once. Inside :func:`sigterm_as_interrupt` a SIGTERM raises
``KeyboardInterrupt`` in the main thread instead, which the training loop already turns into
"write a checkpoint, then stop". torchrun forwards SIGTERM to every worker, so every rank gets its
own KeyboardInterrupt, exactly as with SIGINT. The handler is one-shot: a second SIGTERM (the
scheduler losing patience while the checkpoint is written) gets the previous handler, which by
default ends the process; the checkpoint's manifest, written last, keeps that safe.
"""

from __future__ import annotations

import os
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


class StopSignals:
    """Ctrl-C (SIGINT) and SIGTERM during training: ``KeyboardInterrupt`` where the step can be
    abandoned, a deferred stop where it cannot.

    Outside :meth:`deferred` sections (the rollout, scoring, validation) a signal raises
    ``KeyboardInterrupt`` at once: nothing of the step has touched the weights yet, so the
    trainer saves the last finished step and stops. Inside one (from a step's first optimizer
    update until its engine refresh and data position are done, and while a finished step is
    logged and saved) the signal is noted, one line says so, and ``KeyboardInterrupt`` is raised
    when the section ends: weights that a step has partly updated are never saved as a finished
    step. Each handler is one-shot: a second signal of the same kind gets the previous handler
    (Python's for SIGINT raises ``KeyboardInterrupt`` at once, and the trainer then keeps the
    previous checkpoint; the default for SIGTERM ends the process, the checkpoints on disk being
    complete or absent, never partial).

    Does nothing outside the main thread (Python only delivers signals there)."""

    def __init__(self, say=None):
        self.received: list = []
        self._depth = 0
        self._deferred_signal = None
        self._previous: dict = {}
        self._say = say or (lambda line: os.write(2, (line + "\n").encode()))

    def __enter__(self) -> StopSignals:
        self._depth, self._deferred_signal = 0, None
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in (signal.SIGINT, getattr(signal, "SIGTERM", None)):
            if sig is not None:
                self._previous[sig] = signal.getsignal(sig)
                signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        for sig, previous in self._previous.items():
            if signal.getsignal(sig) == self._handler:
                signal.signal(sig, previous)
        self._previous = {}

    def _handler(self, signum, frame):
        self.received.append(signum)
        signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))   # one-shot
        name = signal.Signals(signum).name
        if self._depth > 0:
            if self._deferred_signal is None:
                self._deferred_signal = signum
                # os.write, not print: a handler may run in the middle of another print
                self._say(f"mopd: {name} received: stopping once this step's update is complete "
                          f"({name} again stops at once, keeping the previous checkpoint)")
            return
        raise KeyboardInterrupt(f"signal {signum} ({name})")

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """A section that a signal does not cut: it is raised as ``KeyboardInterrupt`` at the end."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        if self._depth == 0 and self._deferred_signal is not None:
            signum, self._deferred_signal = self._deferred_signal, None
            raise KeyboardInterrupt(f"signal {signum} ({signal.Signals(signum).name}, deferred)")
