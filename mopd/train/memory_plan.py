"""`mopd plan`: what one GPU must hold for a config, in both phases of a colocated step, before
anything is loaded.

A step has two phases on every GPU (docs/architecture.md, "Performance targets"; mopd.train.weight_sync):

- rollout: the vLLM engine is awake and owns ``gpu_memory_utilization`` of the GPU (its weights,
  activations and KV cache); the trainer keeps only what survives between steps (the fp32 master
  shard, AdamW's moments, the frozen teacher/reference, the CUDA context). vLLM refuses to start or
  wake when free memory is below its share, so the trainer's resident memory must fit in the rest.
- training: the engine sleeps at level 2 (a small residue stays); the trainer adds gradient shards,
  the gathered bf16 layers FSDP2 works on, the activations of one micro-batch and the loss head.

vLLM's share: ``rollout.gpu_memory_utilization`` when it is set; else (the default) the plan chooses
it, as the trainer does on its GPU: all the rollout phase leaves beside the trainer's resident state
and a GPU retriever, less ``MEMORY_HEADROOM_GIB``, at most 0.85 (``mopd.config.free_memory_share``).
A teacher replica is chosen only where it leaves vLLM that largest share; otherwise the teacher is
sharded and vLLM gets the memory (KV cache that holds more calls at once beats fewer all-gathers).

Every number comes from the model's config.json (read offline: a local model directory, a config
bundled in ``mopd/train/model_configs/``, or the Hugging Face cache) and the run config; the few
constants that are not (CUDA context, vLLM's own runtime) are named below and printed with the plan.
Estimates, not measurements: they are meant to refuse what cannot fit and to show where memory goes.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from mopd.config import DEFAULT_GPU_MEMORY_UTILIZATION, MEMORY_HEADROOM_GIB, free_memory_share
from mopd.core.model_dir import hub_snapshot
from mopd.core.run_models import RunModels

GIB = 2 ** 30
BUNDLED = Path(__file__).parent / "model_configs"

CUDA_CONTEXT_GIB = 3.0
"""CUDA context, NCCL communicators and allocator fragmentation per GPU (an allowance)."""
VLLM_ASLEEP_GIB = 1.0
"""What a level-2-sleeping vLLM engine keeps (CUDA graphs, sampler buffers): an allowance."""
VLLM_RUNTIME_GIB = 4.0
"""vLLM's activation peak and CUDA graphs inside its share, besides weights and KV cache."""
H200_GIB = 139.0
"""Usable memory of one H200 as torch reports it."""


class PlanError(ValueError):
    """The config or the model's shape cannot be planned (one line, no traceback)."""


@dataclass(frozen=True)
class ModelShape:
    """The parts of a decoder-only config.json that decide memory (Qwen3/Llama/Qwen2 naming)."""

    vocab: int
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool

    @classmethod
    def from_config(cls, cfg: dict) -> ModelShape:
        try:
            heads = int(cfg["num_attention_heads"])
            return cls(vocab=int(cfg["vocab_size"]), hidden=int(cfg["hidden_size"]),
                       layers=int(cfg["num_hidden_layers"]), intermediate=int(cfg["intermediate_size"]),
                       heads=heads, kv_heads=int(cfg.get("num_key_value_heads") or heads),
                       head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
                       tied=bool(cfg.get("tie_word_embeddings", False)))
        except KeyError as e:
            raise PlanError(f"config.json lacks {e.args[0]!r}: only decoder-only transformer configs can be planned")

    @property
    def layer_params(self) -> int:
        """q/k/v/o projections, the gated MLP, two RMSNorms and Qwen3's q/k norms."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return self.hidden * (q + 2 * kv) + q * self.hidden + 3 * self.hidden * self.intermediate \
            + 2 * self.hidden + 2 * self.head_dim

    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        """Distinct parameters (a tied lm-head counted once)."""
        head = 0 if self.tied else self.embed_params
        return self.embed_params + head + self.layers * self.layer_params + self.hidden

    def lora_params(self, rank: int, targets) -> int:
        """Parameters of rank-``rank`` LoRA adapters (A: r x in, B: out x r) on the projections named
        ``targets`` of every layer (``all-linear``: all seven); names this shape does not know add none."""
        q, kv, h, f = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.hidden, self.intermediate
        io = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h), "gate_proj": (h, f),
              "up_proj": (h, f), "down_proj": (f, h)}
        names = io if tuple(targets) == ("all-linear",) else [t for t in targets if t in io]
        return self.layers * sum(rank * sum(io[t]) for t in names)

    @property
    def kv_bytes_per_token(self) -> int:
        """bf16 keys and values of every layer for one token (vLLM's KV cache)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2

    @property
    def activation_bytes_per_token_layer(self) -> int:
        """bf16 tensors one decoder layer saves for backward, per token: the two norms' inputs and
        outputs, q/k/v (after norm and rotary), the attention output and flash-attn's fp32
        log-sum-exp, the o-projection input, the MLP's gate, up, activation and product."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return 2 * (4 * self.hidden + 3 * q + 2 * kv + 4 * self.intermediate) + 4 * self.heads


def load_model_config(path: str) -> dict:
    """config.json of ``path``: a local directory, else a bundled config (``Org/Name``), else the
    Hugging Face cache; never the network."""
    p = Path(path).expanduser()
    if (p / "config.json").is_file():
        return json.loads((p / "config.json").read_text())
    bundled = BUNDLED / (path.replace("/", "__") + ".json")
    if bundled.is_file():
        return json.loads(bundled.read_text())
    snapshot = hub_snapshot(path)
    if snapshot is not None:
        return json.loads((snapshot / "config.json").read_text())
    known = sorted(f.stem.replace("__", "/") for f in BUNDLED.glob("*.json"))
    raise PlanError(f"no config.json for {path!r}: not a local model directory, not in the Hugging Face cache, "
                    f"and not bundled (bundled: {', '.join(known)})")


@dataclass
class Item:
    name: str
    gib: float
    note: str = ""


@dataclass
class MemoryPlan:
    gpu_gib: float
    world: int
    shape: ModelShape
    training: list[Item] = field(default_factory=list)
    rollout: list[Item] = field(default_factory=list)
    teacher_placement: str = "none"
    lora_views: int = 0
    """LoRA runs: frozen models that are views of the policy's base (no copy)."""
    retriever_gib: float = 0.0
    kv_tokens: int = 0
    max_model_len: int = 0
    gpu_memory_utilization: float = 0.0
    """vLLM's share of the GPU in this plan: the config's, or the plan's choice (``auto_share``)."""
    auto_share: bool = False
    """Whether the plan chose ``gpu_memory_utilization`` (the config left it empty)."""
    problems: list[str] = field(default_factory=list)

    @property
    def training_gib(self) -> float:
        return sum(i.gib for i in self.training)

    @property
    def rollout_gib(self) -> float:
        return sum(i.gib for i in self.rollout)

    @property
    def fits(self) -> bool:
        return not self.problems

    def share_line(self) -> str:
        """One line: vLLM's share and where it came from."""
        if not self.auto_share:
            return f"rollout.gpu_memory_utilization {self.gpu_memory_utilization:g} (as set)"
        return (f"rollout.gpu_memory_utilization {self.gpu_memory_utilization:.2f}, chosen by the memory plan for "
                f"{self.gpu_gib:.0f} GiB GPUs: what the rollout phase leaves beside the trainer"
                f"{' and the retriever' if self.retriever_gib else ''}, less {MEMORY_HEADROOM_GIB:g} GiB of headroom, "
                f"at most {DEFAULT_GPU_MEMORY_UTILIZATION} (set rollout.gpu_memory_utilization to choose it)")

    def render(self) -> str:
        s = self.shape
        lines = [(f"per-GPU memory plan: {self.world} GPU(s) of {self.gpu_gib:.0f} GiB; model {s.params / 1e9:.2f}B "
                  f"parameters ({s.layers} layers, hidden {s.hidden}, vocab {s.vocab}{', tied head' if s.tied else ''}); "
                  f"teacher {self.teacher_placement}")]
        for title, items, total in (("training phase (engine asleep)", self.training, self.training_gib),
                                    ("rollout phase (engine awake)", self.rollout, self.rollout_gib)):
            lines.append(f"  {title}:")
            lines += [f"    {i.name:<38}{i.gib:8.2f} GiB  {i.note}" for i in items]
            lines.append(f"    {'total':<38}{total:8.2f} GiB  of {self.gpu_gib:.0f}")
        calls = self.kv_tokens // max(self.max_model_len, 1)
        lines.append(f"  vLLM KV cache: {self.kv_tokens:,} tokens = {calls} calls of max_model_len {self.max_model_len}")
        lines.append(f"  allowances: CUDA context {CUDA_CONTEXT_GIB} GiB, vLLM runtime {VLLM_RUNTIME_GIB} GiB, "
                     f"sleeping vLLM {VLLM_ASLEEP_GIB} GiB" + (f", headroom {MEMORY_HEADROOM_GIB} GiB" if self.auto_share
                                                              else ""))
        lines.append(self.share_line())
        lines.append("FITS" if self.fits else "DOES NOT FIT: " + "; ".join(self.problems))
        return "\n".join(lines)


def plan_memory(cfg, *, gpu_gib: float = H200_GIB, world: int = 8, model_config: dict | None = None,
                frozen_configs: list[dict] | None = None, retriever_gib: float = 0.0,
                models: RunModels | None = None) -> MemoryPlan:
    """The per-GPU plan of ``cfg`` on ``world`` GPUs of ``gpu_gib`` each (see the module docstring).

    ``retriever_gib``: what a retriever served on the same GPUs holds on each for the whole run
    (``mopd retriever serve --faiss-gpu``: its index shard and faiss's scratch). It is resident in
    both phases, and vLLM counts it as taken when it starts and when it wakes its KV cache after
    the updates (vLLM checks free memory then, not later), so it must fit beside vLLM's share.

    ``model_config``/``frozen_configs`` default to the config.json files the run would load
    (``frozen_configs``: one per frozen model the run loads as a copy, ``RunModels.copies()``); a
    frozen model without a path of its own (a preset before ``teacher.path`` is set) is assumed to
    have the policy's shape, as a Stage-I export has. ``models``: the run's models
    (:class:`mopd.core.run_models.RunModels`, which says which frozen model is a view of the base
    and which a copy); by default built from ``cfg``.
    """
    if world < 1 or gpu_gib <= 0 or retriever_gib < 0:
        raise PlanError(f"world={world} and gpu_gib={gpu_gib} must be positive, retriever_gib={retriever_gib} "
                        "not negative")
    shape = ModelShape.from_config(model_config or load_model_config(cfg.model.path))
    models = models or RunModels.from_config(cfg)
    lora = models.adapters
    views, copies = models.views(), models.copies()
    if frozen_configs is None:
        frozen_configs = [None if models.is_base(f.path) else load_model_config(f.path) for f in copies]
    frozen = [ModelShape.from_config(c) if c else shape for c in frozen_configs]
    plan = MemoryPlan(gpu_gib=gpu_gib, world=world, shape=shape, lora_views=len(views))
    P, W = shape.params, world
    tokens = cfg.trainer.micro_batch_tokens
    ckpt = cfg.model.activation_checkpointing is not False           # None means on, on GPUs
    plan.max_model_len = cfg.rollout.max_input_tokens + cfg.rollout.max_output_tokens

    # trainer state that survives the whole step: fp32 master shard and AdamW's two moments; with
    # LoRA the frozen bf16 base (once) and the fp32 adapters with their moments
    if lora:
        A = shape.lora_params(lora.rank, lora.target_modules)
        adapters = 4 * A * (1 + len(models.adapter_views()))   # the student's + each adapter view
        state = [Item("frozen base, bf16 (shard)", 2 * P / W / GIB, f"2 B x {P / 1e9:.2f}B / {W}, held once"),
                 Item("LoRA adapters, fp32 (shard)", adapters / W / GIB,
                      f"rank {lora.rank}: {A / 1e6:.1f}M parameters" + (f"; + {len(views)} frozen view(s)"
                                                                        if views else "")),
                 Item("adapters' AdamW moments, fp32 (shard)", 8 * A / W / GIB, "2 x 4 B per adapter parameter")]
        trained = A
    else:
        state = [Item("fp32 master weights (shard)", 4 * P / W / GIB, f"4 B x {P / 1e9:.2f}B / {W}"),
                 Item("AdamW moments, fp32 (shard)", 8 * P / W / GIB, "2 x 4 B per parameter / world")]
        trained = P
    context = Item("CUDA context, NCCL, fragmentation", CUDA_CONTEXT_GIB, "allowance")
    served = [Item("GPU retriever (index + faiss scratch)", retriever_gib, "another process, whole run")] \
        if retriever_gib else []
    frozen_bf16 = sum(2 * f.params for f in frozen)
    teacher_items = []
    if frozen:
        cpu_offload = getattr(cfg.teacher, "cpu_offload", False)
        replicated = Item(f"teacher/reference bf16 x{len(frozen)} (replica)", frozen_bf16 / GIB,
                          "one full copy per GPU: scoring without all-gathers")
        sharded_layers = sum(2 * 2 * f.layer_params + 2 * f.embed_params for f in frozen)
        sharded = Item(f"teacher/reference bf16 x{len(frozen)} (shard)",
                       (0 if cpu_offload else frozen_bf16 / W) / GIB + sharded_layers / GIB,
                       "FSDP2 shard + two gathered layers and the embedding while scoring"
                       + (" (shards on CPU)" if cpu_offload else ""))
        teacher_items = [replicated, sharded]

    set_share = cfg.rollout.gpu_memory_utilization
    weights_bf16 = 2 * P / GIB
    tp = max(1, cfg.rollout.tensor_parallel_size)

    def resident_of(teacher: Item | None) -> list[Item]:
        return state + ([teacher] if teacher else []) + [context] + served

    def share_of(teacher: Item | None) -> float:
        if set_share is not None:
            return set_share
        return free_memory_share(gpu_gib - sum(i.gib for i in resident_of(teacher)), gpu_gib)

    def phases(teacher: Item | None, share: float):
        resident = resident_of(teacher)
        gathered = 2 * shape.embed_params + 2 * 2 * shape.layer_params        # root + two layers, bf16
        backward = 2 * (2 + 4) * shape.layer_params * trained // P            # bf16 grads + fp32 reduce, two layers
        act_saved = shape.layers * tokens * shape.hidden * 2 if ckpt else \
            shape.layers * tokens * shape.activation_bytes_per_token_layer
        act_live = tokens * shape.activation_bytes_per_token_layer if ckpt else 0
        loss_head = tokens * shape.hidden * (2 + 4) + GIB                     # hidden + its fp32 grad, <1 GiB chunks
        loss_inputs = tokens * 4 * 6                                          # fp32 per-token signals of a micro-batch
        training = resident + [
            Item("fp32 gradient shard", 4 * trained / W / GIB,
                 "reduce-scattered, fp32" + (" (adapters only)" if lora else "")),
            Item("gathered bf16 params (FSDP2)", gathered / GIB, "root (embedding, norm) + two layers in flight"),
            Item("layer grads + reduce buffers", backward / GIB, "bf16 grads and fp32 reduce-scatter, two layers"),
            Item("activations" + (" (checkpointed)" if ckpt else ""), (act_saved + act_live) / GIB,
                 f"{tokens} tokens: " + ("layer inputs + one layer recomputed" if ckpt else "every layer's tensors")),
            Item("fused loss head + loss inputs", (loss_head + loss_inputs) / GIB, "no [T, V] logits"),
            Item("vLLM asleep (level 1)" if lora else "vLLM asleep (level 2)", VLLM_ASLEEP_GIB,
                 "allowance" + ("; its base weights wait in host memory (LoRA: never re-sent)" if lora else "")),
        ]
        rollout = resident + [Item("vLLM share (weights + KV + runtime)", share * gpu_gib,
                                   f"gpu_memory_utilization {share:g}" + (" (chosen by the plan)"
                                                                         if set_share is None else ""))]
        return training, rollout

    options = [(teacher_items[0], "replicated in bf16 on every GPU"), (teacher_items[1], "FSDP2-sharded")] \
        if frozen else [(None, "a view of the policy's base (LoRA adapter, no copy)" if views else "none")]
    for n, (teacher, name) in enumerate(options):
        share = share_of(teacher)
        training, rollout = phases(teacher, share)
        fits = sum(i.gib for i in training) <= gpu_gib and sum(i.gib for i in rollout) <= gpu_gib
        # A chosen share makes the rollout phase fit by construction: a replica then only where it
        # costs vLLM nothing (its share is still the largest the plan gives).
        if n == len(options) - 1 or (fits and (set_share is not None or share >= DEFAULT_GPU_MEMORY_UTILIZATION)):
            break
    plan.training, plan.rollout, plan.teacher_placement = training, rollout, name
    plan.gpu_memory_utilization, plan.auto_share, plan.retriever_gib = share, set_share is None, retriever_gib
    vllm_share = share * gpu_gib

    kv_gib = vllm_share - weights_bf16 / tp - VLLM_RUNTIME_GIB
    plan.kv_tokens = max(0, int(kv_gib * GIB // (shape.kv_bytes_per_token / tp)))
    if plan.training_gib > gpu_gib:
        big = max(plan.training, key=lambda i: i.gib)
        plan.problems.append(f"training needs {plan.training_gib:.1f} GiB per GPU > {gpu_gib:.0f} (largest: "
                             f"{big.name} {big.gib:.1f} GiB; lower trainer.micro_batch_tokens, keep activation "
                             "checkpointing on, or use more GPUs)")
    resident = plan.rollout_gib - vllm_share
    if plan.rollout_gib > gpu_gib:
        plan.problems.append(f"the trainer keeps {resident:.1f} GiB during rollout but vLLM's "
                             f"gpu_memory_utilization {share:g} leaves it "
                             f"{gpu_gib - vllm_share:.1f} GiB: vLLM would refuse to start (lower "
                             "rollout.gpu_memory_utilization, or leave it empty for the plan's, or use more GPUs)")
    if plan.kv_tokens < plan.max_model_len:
        fix = "raise rollout.gpu_memory_utilization" if set_share is not None else \
            (f"the plan's gpu_memory_utilization {share:.2f} is all the trainer leaves: use more GPUs or larger ones")
        plan.problems.append(f"vLLM's KV cache holds {plan.kv_tokens} tokens, less than one call of max_model_len "
                             f"{plan.max_model_len} ({fix}, or lower rollout.max_input_tokens/max_output_tokens)")
    return plan


def this_gpu(device=None) -> tuple[float, float]:
    """``(total GiB, GiB other processes hold)`` of this process's GPU now: the GPU's memory, and what
    is taken on it beyond this process's allocator (a retriever served there; this process's own
    CUDA context is counted too, as the plan's context allowance counts it: under a GiB twice).
    ``(H200_GIB, 0)`` without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return H200_GIB, 0.0
    free, total = torch.cuda.mem_get_info(device)
    others = max(0, total - free - torch.cuda.memory_reserved(device))
    return total / GIB, others / GIB


def shard_frozen_models(cfg, world: int, gpu_gib: float | None = None, others_gib: float = 0.0) -> bool:
    """Whether the teacher/reference should be FSDP2-sharded rather than replicated in bf16 on
    every GPU: replicate (no all-gather per scoring micro-batch) when the plan fits that way.
    ``gpu_gib`` defaults to this GPU's memory and ``others_gib`` then to what other processes hold
    on it (:func:`this_gpu`), as the trainer's choice of vLLM's share counts them.
    One process never shards; a model whose shape cannot be read is sharded (the safe choice)."""
    if world <= 1:
        return False
    if gpu_gib is None:
        gpu_gib, others_gib = this_gpu()
    try:
        plan = plan_memory(cfg, gpu_gib=gpu_gib, world=world, retriever_gib=others_gib)
        return plan.teacher_placement != "replicated in bf16 on every GPU"
    except (PlanError, OSError, ValueError):
        return True


def rollout_config_for_gpu(cfg, world: int, device=None):
    """``(rollout config, line)``: ``cfg.rollout`` with vLLM's share filled in from the memory plan of
    this GPU (its memory, and what other processes hold on it as the retriever's) when the config
    leaves it empty, and a line saying what was chosen; ``cfg.rollout`` itself and ``""`` for
    another engine, a share that is set, or no CUDA (vLLM's CPU build sizes its KV cache itself).
    Raises :class:`PlanError` when the share the plan leaves holds no call's KV cache."""
    import torch

    r = cfg.rollout
    if r.engine != "vllm" or r.gpu_memory_utilization is not None or not torch.cuda.is_available():
        return r, ""
    total, others = this_gpu(device)
    plan = plan_memory(cfg, gpu_gib=total, world=world, retriever_gib=others)
    if plan.kv_tokens < plan.max_model_len:
        raise PlanError("no room for vLLM on this GPU: " + "; ".join(plan.problems))
    line = (plan.share_line() + f" (this GPU: {total:.0f} GiB, {others:.1f} held by other processes; "
            f"KV cache for {plan.kv_tokens // max(plan.max_model_len, 1)} calls of {plan.max_model_len} tokens)")
    return dataclasses.replace(r, gpu_memory_utilization=plan.gpu_memory_utilization), line
