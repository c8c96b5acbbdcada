"""How a run samples its workflows: the ``rollout`` section of :class:`mopd.config.Config`, and the
GPU memory share a vLLM engine takes."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from mopd.config.checks import ConfigError, choice, positive
from mopd.config.registries import ENGINES
from mopd.core.workflows import workflow, workflow_names

SCHEDULERS = ("auto", "lockstep", "async")
"""Rollout schedulers (``rollout.scheduler``; ``mopd.rollout.async_scheduler.run_rollout``)."""

DEFAULT_GPU_MEMORY_UTILIZATION = 0.85
"""vLLM's GPU memory share where nothing chose one (`mopd rollout`, a CPU), and the largest share an
automatic choice gives it (vLLM's own default is 0.9: the rest stays free for what the memory plan's
allowances miss, and on an H200 a teacher replica fits beside it)."""
MEMORY_HEADROOM_GIB = 2.0
"""What an automatic share leaves free on the GPU beside everything it counts (estimates, and the
allocator's fragmentation)."""


def free_memory_share(free_gib: float, total_gib: float) -> float:
    """The share of a GPU of ``total_gib`` that vLLM may take when ``free_gib`` of it are free: what is
    free less ``MEMORY_HEADROOM_GIB``, rounded down to 0.01, at most
    ``DEFAULT_GPU_MEMORY_UTILIZATION``; 0 when nothing is left."""
    share = math.floor(100 * (free_gib - MEMORY_HEADROOM_GIB) / total_gib + 1e-9) / 100 if total_gib > 0 else 0.0
    return max(0.0, min(DEFAULT_GPU_MEMORY_UTILIZATION, share))


@dataclass
class RolloutConfig:
    engine: str = "hf"
    """A registered engine (:data:`mopd.config.ENGINES`): hf (transformers, CPU or CUDA) or vllm
    (colocated vLLM, needs the gpu extra), as :mod:`mopd.rollout.engines` registers them."""
    workflow: str = "cmas"
    """A workflow of the table (:mod:`mopd.core.workflows`): cmas (Searcher -> Answerer cascade) or
    hmas (Leader -> waves of Searchers -> Answerer)."""
    group_size: int = 5
    """G: trajectories sampled per question."""
    answer_candidates: int = 5
    """Answerer candidates per answering request."""
    temperature: float = 1.0
    """Sampling temperature of every role during training rollouts."""
    top_p: float = 1.0
    """Nucleus sampling mass during training rollouts."""
    max_input_tokens: int = 8192
    """Per-call prompt limit: longer inputs are cut from the left of the history and recorded."""
    max_output_tokens: int = 512
    """Per-call output limit (EOS included)."""
    max_steps: int = 5
    """Environment steps per workflow (C-MAS 5, H-MAS 12)."""
    max_rounds: int = 5
    """H-MAS delegation rounds before the Leader is forced to select."""
    max_searchers_per_wave: int = 0
    """H-MAS: at most this many Searchers per wave; 0 = no cap (the paper has none). Subtasks beyond
    a cap are dropped, each recorded as a ``dropped_subtask`` event and counted in the diagnostics."""
    searcher_sees_question: bool = False
    """H-MAS: also show each Searcher the whole question ("Your task: ... It is part of the question:
    ..."). Off (the paper): a Searcher sees its subtask exactly where and how a C-MAS Searcher sees
    the question, the interface the Stage-I teacher was trained on. On, the teacher scores a template
    it never saw, and a Searcher can bypass the Leader's decomposition."""
    max_batch_calls: int = 256
    """Upper bound on agent calls sent to the engine in one generate() batch."""
    scheduler: str = "auto"
    """Rollout scheduler: auto (the engine's preference: asynchronous for vLLM, lock-step for the HF
    engine, measured faster on CPU), lockstep (every workflow's step together; bit-reproducible), or
    async (every turn submitted as soon as its inputs are ready). The records are the same."""
    gpu_memory_utilization: Optional[float] = None
    """vLLM: fraction of GPU memory for its weights and KV cache while it generates. Empty (the
    default): training takes the largest share, at most 0.85, that its memory plan leaves on this GPU
    beside the trainer's resident state and what other processes hold there (a GPU retriever), and
    says what it chose (`mopd plan` prints the same choice: 0.85 on an H200, 0.76 on an 80 GiB H100
    beside a 6 GiB retriever); `mopd eval run` on a GPU takes what is free (``free_memory_share``);
    anything else 0.85. The engine sleeps (level 2: both freed) while the trainer scores and
    updates, so the two never need the GPU at the same time; `mopd plan` checks both phases."""
    tensor_parallel_size: int = 1
    """vLLM tensor parallelism."""
    seed: int = 0
    """Base sampling seed; each step and call derives its own."""

    def __post_init__(self):
        choice("rollout.engine", self.engine, ENGINES)
        choice("rollout.workflow", self.workflow, workflow_names())
        choice("rollout.scheduler", self.scheduler, SCHEDULERS)
        for name in ("group_size", "answer_candidates", "max_input_tokens", "max_output_tokens",
                     "max_steps", "max_rounds", "max_batch_calls", "tensor_parallel_size"):
            positive(f"rollout.{name}", getattr(self, name))
        fewest = workflow(self.workflow).min_steps
        if self.max_steps < fewest:
            raise ConfigError(f"rollout.max_steps={self.max_steps}: a {self.workflow} run needs at least {fewest} "
                              f"environment steps ({workflow(self.workflow).description}); set "
                              f"rollout.max_steps>={fewest}")
        positive("rollout.max_searchers_per_wave", self.max_searchers_per_wave, allow_zero=True)
        positive("rollout.temperature", self.temperature)
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"rollout.top_p={self.top_p} must be in (0, 1]")
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization < 1:
            raise ConfigError("rollout.gpu_memory_utilization must be in (0, 1), or empty for the memory plan's")

    def vllm_memory_share(self) -> float:
        """``gpu_memory_utilization`` as set, else ``DEFAULT_GPU_MEMORY_UTILIZATION`` (the trainer and
        `mopd eval run` fill it in first where they can plan)."""
        if self.gpu_memory_utilization is None:
            return DEFAULT_GPU_MEMORY_UTILIZATION
        return self.gpu_memory_utilization
