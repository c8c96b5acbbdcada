"""What each stage needs before it runs: memory per GPU (the training stages' plan from
:mod:`mopd.train.memory_plan`, as `mopd plan` prints it) and disk. Nothing is loaded: a model's
size comes from its config.json (a local directory, a bundled config, or the Hugging Face cache).

Disk: a checkpoint holds 12 bytes a parameter (fp32 master weights and AdamW's two moments); a
run keeps ``trainer.keep_checkpoints`` of them plus the best-validation one; a LoRA run's
checkpoints hold its adapters alone (the base is frozen). An export holds the weights once: fp32
when `mopd export` writes it (it loads the checkpoint's fp32 master weights), else in the training
dtype; a LoRA run's merged export is the whole model in fp32, its adapter export the adapters in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from mopd.pipeline.config import PipelineConfig, _flag
from mopd.pipeline.stages import EvalStage, ExportStage, ReportStage, Stage, TrainStage
from mopd.train.memory_plan import ModelShape, PlanError, load_model_config
from mopd.train.memory_plan import plan_memory

GB = 1e9
GIB = 2 ** 30
CHECKPOINT_BYTES_PER_PARAM = 12
"""fp32 master weights (4) and AdamW's two fp32 moments (8)."""


@dataclass
class Footprint:
    memory: str
    """Memory per GPU, in words."""
    disk_bytes: Optional[float]
    """Disk the stage writes (None: unknown)."""
    disk: str
    """How the disk figure is made up (or what the stage writes, when it is small)."""
    small: bool = False
    """The stage writes little (records, a report): not counted."""


def parameters(model: str) -> tuple[Optional[int], str]:
    """The parameter count of ``model`` from its config.json, or None and the reason."""

    try:
        return ModelShape.from_config(load_model_config(model)).params, ""
    except (PlanError, OSError, ValueError) as e:
        text = str(e)
        return None, text.split(":")[0] if text.startswith("no config.json") else text


def lora_parameters(stage: TrainStage) -> tuple[Optional[int], str]:
    """A LoRA run's adapter parameter count from its base's config.json, or None and the reason."""

    models = stage.models
    try:
        return ModelShape.from_config(load_model_config(models.base)).lora_params(models.adapters.rank,
                                                                                  models.adapters.target_modules), ""
    except (PlanError, OSError, ValueError) as e:
        text = str(e)
        return None, text.split(":")[0] if text.startswith("no config.json") else text


def _frozen_configs(stage: TrainStage) -> list:
    """config.json of each frozen model the run loads as a copy; None (the policy's shape) for the
    base itself or one not built yet (a Stage-I export, when Stage II is planned before Stage I ran)."""

    out = []
    models = stage.models
    for f in models.copies():
        try:
            out.append(None if models.is_base(f.path) else load_model_config(f.path))
        except PlanError:
            out.append(None)
    return out


def _train_memory(stage: TrainStage, cfg: PipelineConfig) -> str:
    if cfg.launcher.kind == "inprocess":
        return "CPU, in this process (no GPU plan)"

    L = cfg.launcher
    try:
        p = plan_memory(stage.config, gpu_gib=L.gpu_gib, world=L.gpus, frozen_configs=_frozen_configs(stage),
                        retriever_gib=L.retriever_gib, models=stage.models)
    except Exception as e:   # a shape the planner cannot read, a value it refuses
        return f"unknown ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
    verdict = "fits" if p.fits else "DOES NOT FIT: " + "; ".join(p.problems)
    return (f"training {p.training_gib:.1f} GiB, rollout {p.rollout_gib:.1f} GiB of {L.gpu_gib:.0f} on each of "
            f"{L.gpus} GPU(s), teacher {p.teacher_placement}: {verdict}")


def footprint(stage: Stage, cfg: PipelineConfig) -> Footprint:
    """Memory per GPU and disk of one stage."""
    if isinstance(stage, TrainStage):
        lora = stage.models.trains_adapters
        n, why = lora_parameters(stage) if lora else parameters(stage.config.model.path)
        what = f"{'adapter ' if lora else ''}parameters"
        keep = stage.config.trainer.keep_checkpoints + 1
        if n is None:
            return Footprint(_train_memory(stage, cfg), None, f"unknown ({why}); {keep} checkpoints x 12 B "
                             + ("an adapter parameter" if lora else "a parameter"))
        return Footprint(_train_memory(stage, cfg), keep * CHECKPOINT_BYTES_PER_PARAM * n,
                         f"{keep} checkpoints ({stage.config.trainer.keep_checkpoints} kept + the best) x 12 B x "
                         f"{_count(n) if lora else f'{n / 1e9:.2f}B'} {what}")
    if isinstance(stage, ExportStage):
        if stage.adapter:
            n, why = lora_parameters(stage.train)
            memory = "host RAM: the fp32 model" if cfg.launcher.kind == "subprocess" else \
                "none beyond its training stage's (the same trainer)"
            if n is None:
                return Footprint(memory, None, f"unknown ({why}); fp32 adapter weights")
            return Footprint(memory, 4 * n, f"fp32 adapter weights, 4 B x {_count(n)} parameters")
        n, why = parameters(stage.train.config.model.path)
        lora = stage.train.models.trains_adapters
        width = 2 if cfg.launcher.kind == "inprocess" and stage.train.config.model.dtype == "bfloat16" and not lora \
            else 4
        dtype = "bf16" if width == 2 else "fp32"
        memory = ("host RAM: the fp32 model" + (f", {4 * n / GIB:.1f} GiB" if n else "") if cfg.launcher.kind ==
                  "subprocess" else "none beyond its training stage's (the same trainer)")
        if n is None:
            return Footprint(memory, None, f"unknown ({why}); {dtype} weights")
        return Footprint(memory, width * n, f"{dtype} weights, {width} B x {n / 1e9:.2f}B parameters")
    if isinstance(stage, EvalStage):
        return Footprint(_eval_memory(stage, cfg), None, "records", small=True)
    if isinstance(stage, ReportStage):
        return Footprint("none (CPU)", None, "report, metrics and plots", small=True)
    return Footprint("CPU, in this process", None, stage.disk(), small=True)


def _eval_memory(stage: EvalStage, cfg: PipelineConfig) -> str:
    if cfg.launcher.kind == "inprocess":
        return "CPU, in this process"
    r = stage.config.rollout
    if r.engine == "vllm":
        share = getattr(r, "vllm_memory_share", None)
        util = share() if share else (r.gpu_memory_utilization or 0.85)
        where = _eval_gpus(cfg)
        text = (f"vLLM on {where}: gpu_memory_utilization {util} x {cfg.launcher.gpu_gib:.0f} GiB = "
                f"{util * cfg.launcher.gpu_gib:.0f} GiB (weights + KV cache)")
        return text if r.gpu_memory_utilization else text.replace(f"vLLM on {where}: ", f"vLLM on {where}, at most ") + \
            "; `mopd eval run` takes what is free there"
    n, _ = parameters(stage.model_dir if Path(stage.model_dir).is_dir() else cfg.model)
    weights = f"{2 * n / GIB:.1f} GiB of 16-bit weights" if n else "the 16-bit weights"
    return f"{weights} + the KV cache of its batch (HF engine, {_eval_gpus(cfg)})"


def _eval_gpus(cfg: PipelineConfig) -> str:
    """Where an evaluation runs: one GPU, or each of the GPUs its torchrun launcher starts ranks on."""
    per_node, nodes = _flag(cfg.launcher.eval, "nproc_per_node"), _flag(cfg.launcher.eval, "nnodes") or "1"
    if per_node and per_node.isdigit() and nodes.isdigit() and int(per_node) * int(nodes) > 1:
        return f"each of {int(per_node) * int(nodes)} GPUs (one rank each, a share of the questions)"
    return "one GPU"


def _count(n: int) -> str:
    """A parameter count in words (0.60B, 1.2M)."""
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"


def human_bytes(n: Optional[float]) -> str:
    if n is None:
        return "unknown"
    return f"{n / GB:.1f} GB" if n >= 0.1 * GB else f"{n / 1e6:.1f} MB"
