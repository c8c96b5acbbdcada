"""What a run reads: the policy model, the questions and the retriever (sections ``model``, ``data``,
``retriever`` of :class:`mopd.config.Config`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from mopd.config.checks import choice, positive

DTYPES = ("auto", "float32", "bfloat16", "float16")
"""Weight dtypes a model or engine can be loaded in (auto: per device)."""
ATTN_IMPLEMENTATIONS = ("auto", "sdpa", "eager", "flash", "varlen", "flex", "packed_sdpa")
"""``model.attn_implementation``'s values (the field's docstring says what each one means)."""


@dataclass
class ModelConfig:
    path: str = ""
    """Hugging Face model directory (or hub id already in the user's cache) of the policy pi_0."""
    dtype: str = "auto"
    """Parameter dtype of training (and of rollout engines): auto (bf16 on CUDA, fp32 on CPU),
    float32, bfloat16, or float16 (for engines only: training refuses it, having no loss scaling).
    Evaluation engines take ``eval.dtype`` instead (float16 on GPU, as the paper evaluates)."""
    activation_checkpointing: Optional[bool] = None
    """Recompute each decoder layer's activations in the backward pass to save memory. None (the
    default): on for CUDA (a 16k-token micro-batch of Qwen3-4B keeps ~40 GiB of activations
    otherwise; see `mopd plan`), off on CPU."""
    use_liger: bool = True
    """Use Liger's RMSNorm/SwiGLU/RoPE kernels on CUDA when liger-kernel is installed."""
    attn_implementation: str = "auto"
    """Attention of the training forward and the no-grad scoring passes (pi_old, teacher,
    reference) over a packed micro-batch. ``auto``: on CUDA flash-attn's varlen kernel when
    flash-attn is installed, else ``varlen``, else ``sdpa``; on CPU ``packed_sdpa``. ``flash``:
    flash-attn's varlen kernel (CUDA, flash-attn installed). ``varlen``: torch's own FlashAttention
    varlen kernel (``torch.nn.attention.varlen``; CUDA, torch 2.10 and later), no flash-attn
    needed. ``flex``: FlexAttention with a per-call causal block mask, compiled once (CPU or
    CUDA; FlexAttention has no CPU backward, so the CPU update runs ``packed_sdpa``'s attention).
    ``packed_sdpa``: one SDPA call per agent call over the packed row (any device). These four
    run every layer on the packed tokens only. ``sdpa`` and ``eager``: the calls laid out as a
    right-padded [calls, longest] batch, so every layer also runs on the padding."""
    chat_template_kwargs: Dict[str, Any] = field(default_factory=dict)
    """Extra variables for every chat-template rendering of every call, in rollouts, evaluation and
    training alike (e.g. ``model.chat_template_kwargs.enable_thinking=false`` for Qwen3's hybrid
    models, which then write no reasoning)."""
    trust_remote_code: bool = False
    """Allow model directories whose config.json or tokenizer_config.json names Python code of their
    own (``auto_map``) and run that code in this process when loading them (transformers'
    ``trust_remote_code``). Off: such a directory is refused in one line by every command, and
    nothing from it runs. Recorded in run.json with the rest of the config."""

    def __post_init__(self):
        choice("model.dtype", self.dtype, DTYPES)
        choice("model.attn_implementation", self.attn_implementation, ATTN_IMPLEMENTATIONS)


@dataclass
class DataConfig:
    train: str = ""
    """Training questions: FlashRAG jsonl or Search-R1 parquet."""
    dev: str = ""
    """Validation questions (same formats); empty disables validation."""
    dev_size: int = 1000
    """How many dev questions each validation uses (the first N, fixed across the run); the paper
    validates on a fixed 1,000-question development set and evaluates the checkpoint nearest the
    validation peak (kept as ``checkpoints/best.json``, exported with ``--checkpoint best``)."""
    skip_malformed: bool = False
    """Skip malformed rows (counted and reported) instead of stopping with an error."""

    def __post_init__(self):
        positive("data.dev_size", self.dev_size)


@dataclass
class RetrieverConfig:
    kind: str = "inprocess"
    """inprocess (an index directory loaded into this process) or http (a Search-R1-style server)."""
    index: str = ""
    """Index directory built by `mopd retriever build-index` or `import-index` (kind=inprocess), or
    ``bundled``: the bundled corpus of 2,400 invented passages (a toy for smoke runs).
    Empty with kind=inprocess: no retriever, which `mopd train` and `mopd eval run` refuse."""
    url: str = "http://127.0.0.1:8000"
    """Server address (kind=http)."""
    topk: int = 3
    """Passages returned per search action."""
    timeout_s: float = 30.0
    """HTTP timeout per request."""
    retries: int = 5
    """Retries with exponential backoff before the run stops with a clear error."""
    token_file: str = ""
    """kind=http: a file whose first line is the shared token of a server started with
    ``mopd retriever serve --token-file`` (sent as ``Authorization: Bearer``); empty: none. Not
    part of the run's identity: the token may change between runs."""

    def __post_init__(self):
        choice("retriever.kind", self.kind, {"inprocess", "http"})
        positive("retriever.topk", self.topk)
        positive("retriever.timeout_s", self.timeout_s)
        positive("retriever.retries", self.retries, allow_zero=True)
