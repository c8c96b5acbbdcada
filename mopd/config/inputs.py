"""What a run reads: the policy model, the questions and the retriever (sections ``model``, ``data``,
``retriever`` of :class:`mopd.config.Config`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

from mopd.config.checks import ConfigError, choice, positive

DTYPES = ("auto", "float32", "bfloat16", "float16")
"""Weight dtypes a model or engine can be loaded in (auto: per device)."""
ATTN_IMPLEMENTATIONS = ("auto", "sdpa", "eager", "flash", "varlen", "flex", "packed_sdpa")
"""``model.attn_implementation``'s values (the field's docstring says what each one means)."""

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""``model.lora.target_modules``'s default: every projection of the attention and the MLP of the
Qwen2/Qwen3, Llama and Mistral families (PEFT's and verl's usual choice); the lm head is never one."""


@dataclass
class LoraConfig:
    """Low-rank adapters (PEFT's LoRA) over a frozen base: with ``rank`` > 0 only the adapters
    train (fp32, with their own AdamW); the base model is held once, in the compute dtype, with no
    master copy and no optimizer state, and a teacher or reference given as an adapter (or as the
    base itself) is a view of that same base (``mopd.train.lora``)."""

    rank: int = 0
    """The adapters' rank r; 0: no LoRA, full fine-tuning (the default)."""
    alpha: float = 32.0
    """LoRA's alpha: the update is scaled by alpha / rank (16 with rank 16 and alpha 32, say). With
    LoRA the learning rate is usually 10-20x that of full fine-tuning (docs/gpu_training.md)."""
    dropout: float = 0.0
    """Dropout on the adapters' input while training. 0 by default: the PPO ratio compares the
    training forward with the no-grad pi_old pass, which dropout would make differ on-policy."""
    target_modules: Tuple[str, ...] = LORA_TARGETS
    """Module names (the last component, as PEFT matches them) that get adapters, or
    ``all-linear`` (every linear layer but the output head). The lm head cannot be one: the fused
    loss head takes it as one plain weight matrix."""

    def __post_init__(self):
        positive("model.lora.rank", self.rank, allow_zero=True)
        positive("model.lora.alpha", self.alpha)
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.lora.dropout={self.dropout}: expected a number in [0, 1)")
        if isinstance(self.target_modules, str):
            self.target_modules = tuple(t.strip() for t in self.target_modules.split(",") if t.strip())
        self.target_modules = tuple(self.target_modules)
        if not self.target_modules:
            raise ConfigError("model.lora.target_modules is empty: name the modules that get adapters "
                              f"(default {','.join(LORA_TARGETS)}) or all-linear")
        if "all-linear" in self.target_modules and len(self.target_modules) > 1:
            raise ConfigError(f"model.lora.target_modules={','.join(self.target_modules)}: all-linear already names "
                              "every linear layer; give it alone, or list module names without it")
        if "lm_head" in self.target_modules:
            raise ConfigError("model.lora.target_modules: lm_head cannot take an adapter (the fused loss head "
                              "reads it as one plain weight); adapt the decoder's projections instead")

    @property
    def enabled(self) -> bool:
        return self.rank > 0


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
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters instead of full fine-tuning (``model.lora.rank=16``); off by default."""

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
