"""What one rollout did with its time: engine busy fraction, batch size in flight, retrieval wait,
generated tokens per second per role.

The engine and retrieval fronts (:mod:`mopd.rollout.async_engine`,
:mod:`mopd.rollout.async_retrieval`) feed a :class:`BusyMeter` each; under the lock-step scheduler
:class:`MeteredEngine` and :class:`MeteredRetriever` do. The scheduler turns the two meters, the
wall time and the records into one :class:`RolloutStats`, which the trainer logs per step
(:meth:`RolloutStats.as_metrics`).

Definitions (all over one rollout):
- busy fraction: seconds the engine was computing (inside ``generate`` or one engine step) over
  the rollout's wall seconds;
- mean batch rows: sampled sequences in flight, averaged over the engine's busy time (a
  ``generate`` call of 40 rows that takes 2 s weighs twice a 1 s call);
- retrieval wait: mean seconds from a search's submission to its passages (queueing included);
- tokens per second of a role: its generated tokens (EOS included) over the wall seconds.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Dict, Sequence

from mopd.core.roles import role_names


class BusyMeter:
    """Thread-safe totals of work units (an engine call or step, a retrieval batch)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.busy_s = 0.0
        self.units = 0
        self.rows = 0
        self.row_seconds = 0.0
        """Sum of rows x duration: divided by busy_s, the time-weighted rows in flight."""
        self.waits = 0
        self.wait_s = 0.0

    def work(self, seconds: float, rows: int) -> None:
        with self._lock:
            self.busy_s += seconds
            self.units += 1
            self.rows += rows
            self.row_seconds += rows * seconds

    def wait(self, seconds: float) -> None:
        """One request's time from submission to result."""
        with self._lock:
            self.waits += 1
            self.wait_s += seconds

    @property
    def mean_rows(self) -> float:
        return self.row_seconds / self.busy_s if self.busy_s > 0 else 0.0

    @property
    def mean_wait_s(self) -> float:
        return self.wait_s / self.waits if self.waits else 0.0


@dataclass
class RolloutStats:
    wall_s: float
    """Seconds from the first submission to the last run's end."""
    engine_busy_s: float
    """Seconds the engine was computing."""
    engine_calls: int
    """generate() calls (synchronous engines) or engine steps (vLLM)."""
    mean_batch_rows: float
    """Sampled sequences in flight, averaged over the engine's busy time."""
    retrieval_batches: int
    """Retriever calls made (each a micro-batch of the searches pending at the time)."""
    retrieval_queries: int
    """Queries searched."""
    retrieval_busy_s: float
    """Seconds the retriever was computing (overlapping the engine under the async scheduler)."""
    retrieval_wait_s: float
    """Mean seconds from a search's submission to its passages."""
    failed_runs: int = 0
    """Runs ended by a retrieval error or timeout (a 'limit' event with text 'retrieval: ...')."""
    tokens: Dict[str, int] = field(default_factory=dict)
    """Generated tokens per role (EOS included)."""

    @property
    def busy_fraction(self) -> float:
        return self.engine_busy_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def tokens_per_s(self) -> Dict[str, float]:
        """Generated tokens per wall second, per role and 'all'."""
        out = {role: n / self.wall_s if self.wall_s > 0 else 0.0 for role, n in self.tokens.items()}
        out["all"] = sum(self.tokens.values()) / self.wall_s if self.wall_s > 0 else 0.0
        return out

    @classmethod
    def collect(cls, wall_s: float, engine: BusyMeter, retrieval: BusyMeter, records: Sequence,
                failed_runs: int = 0) -> "RolloutStats":
        tokens = {role: 0 for role in role_names()}
        for rec in records:
            for call in rec.calls:
                tokens[call.role] = tokens.get(call.role, 0) + call.output_tokens
        return cls(wall_s=wall_s, engine_busy_s=engine.busy_s, engine_calls=engine.units,
                   mean_batch_rows=engine.mean_rows, retrieval_batches=retrieval.units,
                   retrieval_queries=retrieval.rows, retrieval_busy_s=retrieval.busy_s,
                   retrieval_wait_s=retrieval.mean_wait_s, failed_runs=failed_runs, tokens=tokens)

    def as_metrics(self, prefix: str = "rollout/") -> Dict[str, float]:
        """Flat scalars for a metrics log."""
        m = {"wall_s": self.wall_s, "busy_fraction": self.busy_fraction,
             "mean_batch_rows": self.mean_batch_rows,
             "engine_calls": float(self.engine_calls), "retrieval_wait_s": self.retrieval_wait_s,
             "retrieval_busy_s": self.retrieval_busy_s, "retrieval_batches": float(self.retrieval_batches),
             "failed_runs": float(self.failed_runs)}
        m.update({f"tokens_per_s/{k}": v for k, v in self.tokens_per_s.items()})
        return {prefix + k: float(v) for k, v in m.items()}


class MeteredEngine:
    """An engine whose ``generate`` calls are timed into ``meter`` (one unit per call; rows: the
    sampled sequences; wait: the call's duration, for each request)."""

    def __init__(self, engine, meter: BusyMeter):
        self.engine, self.meter = engine, meter

    def generate(self, requests):
        start = time.perf_counter()
        out = self.engine.generate(requests)
        seconds = time.perf_counter() - start
        self.meter.work(seconds, sum(r.params.n for r in requests))
        for _ in requests:
            self.meter.wait(seconds)
        return out

    def __getattr__(self, name):  # tokenizer, reset_prefix_cache, ...
        return getattr(self.engine, name)


class MeteredRetriever:
    """A retriever whose ``search`` calls are timed into ``meter`` (rows: queries)."""

    def __init__(self, retriever, meter: BusyMeter):
        self.retriever, self.meter = retriever, meter

    def search(self, queries, k):
        start = time.perf_counter()
        out = self.retriever.search(queries, k)
        seconds = time.perf_counter() - start
        self.meter.work(seconds, len(queries))
        for _ in queries:
            self.meter.wait(seconds)
        return out
