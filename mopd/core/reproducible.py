"""Bit-reproducible CPU runs: the process environment and torch settings under which a seeded run
on the CPU (a world's build, retrieval index, warm start, Stage I/II, evaluation) gives the same bits.

What decides the bits on a CPU, and what pins it (measured on the 2-core Xeon dev box, 2026-12-01,
a 0.7M-parameter Qwen3 trained 7 AdamW steps; bench/RESULTS.md "Reproducibility"):

- MKL picks a code branch for the CPU it finds (SSE2 ... AVX-512); each branch sums in its own
  order. ``MKL_CBWR=AVX2`` fixes the AVX2 branch: the same results on every Intel CPU with AVX2
  (MKL's documented guarantee), at the default's speed. Forcing the AVX2 branch on this AVX-512
  box changed the weights, so without it an AVX2-only and an AVX-512 machine disagree.
  ``MKL_CBWR=COMPATIBLE`` (SSE2) is the only branch MKL promises across vendors (AMD too), but
  training steps took 2-2.5x as long, so it is an opt-in (set it in the environment yourself).
- torch's own vectorised kernels (softmax, norms, reductions, SDPA on CPU) are compiled for
  several ISAs and chosen at run time; ``ATEN_CPU_CAPABILITY=avx2`` selects the AVX2 build on
  every CPU that has it (changing it alone also changed the weights). ``ONEDNN_MAX_CPU_ISA`` caps
  oneDNN the same way.
- Thread counts: intra-op reductions split by thread count, so every stage runs one intra-op and
  one inter-op thread (also the fast setting for these tiny ops on a shared machine).

These variables are read when torch loads its libraries, so they must be in the environment
before ``import torch``: the ``mopd`` command sets them (:func:`pin_cpu_environment`, called by
``mopd.cli.main`` for the commands that ask for it, ``pin_cpu=True``, before any handler imports
torch). A value the user already set wins (e.g. ``MKL_CBWR=COMPATIBLE`` for cross-vendor runs), and
:func:`environment_record` writes what was in force into the run directory.

The module imports nothing heavy: torch is imported inside the functions that need it.
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Dict, MutableMapping, Optional

CPU_ENV: Dict[str, str] = {
    "MKL_CBWR": "AVX2",
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "MKL_DYNAMIC": "FALSE",
}
"""The environment of a reproducible CPU run (see the module docstring for each entry)."""

_STATE = {"pinned_before_torch": None}


def pin_cpu_environment(env: Optional[MutableMapping[str, str]] = None) -> Dict[str, str]:
    """Put :data:`CPU_ENV` into ``env`` (default ``os.environ``) where a variable is not set yet;
    returns the values now in force. Effective only before torch is first imported in this
    process; whether it was is remembered for :func:`environment_record`."""
    target = os.environ if env is None else env
    for key, value in CPU_ENV.items():
        target.setdefault(key, value)
    if env is None:
        _STATE["pinned_before_torch"] = "torch" not in sys.modules
    return {k: target[k] for k in CPU_ENV}


def deterministic_torch(threads: int = 1) -> None:
    """One stage's torch settings: ``threads`` intra-op threads, one inter-op thread (settable only
    before the first parallel op: a later call keeps what is set) and deterministic algorithms
    (an op without a deterministic CPU implementation raises instead of varying)."""
    import torch

    torch.set_num_threads(threads)
    if torch.get_num_interop_threads() != 1:
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass  # already started: inter-op parallelism is unused by these single-process stages
    torch.use_deterministic_algorithms(True)


def environment_record() -> Dict[str, object]:
    """What decides the bits of this process: the pinned variables, torch's version, the ISA its
    kernels use, thread counts, and whether the environment was pinned before torch loaded."""
    import torch

    return {
        "env": {k: os.environ.get(k) for k in CPU_ENV},
        "pinned_before_torch": _STATE["pinned_before_torch"],   # None: not pinned by mopd in this process
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "machine": platform.machine(),
        "processor": _cpu_model(),
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass

    return platform.processor()
