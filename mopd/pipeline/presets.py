"""Named pipelines (functions returning a :class:`PipelineConfig`, registered under their own names
as method presets are, :func:`mopd.config.register_preset`) and their resolution: a preset, then a
YAML file, then dotted overrides (``stage1.steps=300``, ``launcher.gpus=16``), by the resolver that
resolves a run's config (:mod:`mopd.config.resolver`). A YAML file is one layer on top of the
preset: no inheritance between files. Any module can add a pipeline with ``@pipeline_preset`` (a
recipe adds its own: :mod:`mopd.recipes`).
"""

from __future__ import annotations

from typing import Callable, List, Optional, Union

from mopd.config import ConfigError, ConfigKind, RetrieverConfig
from mopd.config.resolver import build, merge_layers
from mopd.core.registry import Registry
from mopd.pipeline.config import (DataPaths, EvalSettings, LauncherConfig, PipelineConfig, ReportSettings,
                                  SystemConfig, TeacherCheckSettings, TrainStageConfig)

PIPELINES: Registry = Registry("pipeline", error=ConfigError)
"""Pipeline presets by name: functions returning a PipelineConfig (read it as a mapping)."""


def pipeline_preset(fn: Callable[[], PipelineConfig]) -> Callable[[], PipelineConfig]:
    """Decorator: register a function returning a PipelineConfig under its own name."""
    return PIPELINES.register(fn)


PIPELINE_CONFIG = ConfigKind(noun="pipeline", what="pipeline config",
                             key_help=" (training-stage settings go in overrides=[KEY=VALUE,...] or stageN.overrides)")
"""The pipeline config's words for the shared resolver."""


PAPER_MODEL = "Qwen/Qwen3-4B-Instruct-2507"


@pipeline_preset
def paper() -> PipelineConfig:
    """The paper's run on 8 GPUs: Stage I, its export, MultiAgent-OPD and the Prompted Critic baseline,
    their exports, the five systems evaluated with the paper's protocol, and the report."""
    gpu = ["rollout.engine=vllm"]
    return PipelineConfig(
        name="paper",
        description="The paper's run (8 GPUs): Stage I (cmas_rl), Stage II (mopd) and the Prompted Critic "
                    "baseline from the same base model, the five systems evaluated (4 attempts) and reported.",
        root="runs/paper", model=PAPER_MODEL,
        data=DataPaths(train="splits/train.jsonl", dev="splits/dev.jsonl", test="splits/test.jsonl"),
        retriever=RetrieverConfig(kind="http", url="http://127.0.0.1:8000"),
        stage1=TrainStageConfig(name="C-MAS + RL", preset="cmas_rl", dir="stage1", overrides=list(gpu),
                                label="Stage I (C-MAS + RL)"),
        stage2={"mopd": TrainStageConfig(name="MultiAgent-OPD", preset="mopd", dir="stage2", overrides=list(gpu),
                                         label="Stage II (MultiAgent-OPD)"),
                "prompted_critic": TrainStageConfig(name="Prompted Critic", preset="prompted_critic",
                                                    dir="stage2_prompted_critic", overrides=list(gpu),
                                                    label="Stage II (Prompted Critic)")},
        systems=[SystemConfig("C-MAS base", "base", "cmas"), SystemConfig("C-MAS + RL", "stage1", "cmas"),
                 SystemConfig("H-MAS base", "base", "hmas"), SystemConfig("Prompted Critic", "prompted_critic", "hmas"),
                 SystemConfig("MultiAgent-OPD", "mopd", "hmas")],
        eval=EvalSettings(attempts=4, overrides=list(gpu)),
        teacher_check=TeacherCheckSettings(questions=1000),   # as many as Stage I validates on (data.dev_size)
        report=ReportSettings(kind="eval", reference="MultiAgent-OPD", title="MultiAgent-OPD: the paper's run"),
        launcher=LauncherConfig(kind="subprocess", train="torchrun --nproc_per_node 8 -m mopd",
                                eval="torchrun --nproc_per_node 8 -m mopd", gpus=8,
                                gpu_gib=80.0, retriever_gib=6.0),
    )


def resolve_pipeline(preset: Union[str, PipelineConfig, None], overrides: Optional[List[str]] = None,
                     yaml_file: Optional[str] = None) -> PipelineConfig:
    """A pipeline: ``preset`` (a name in :data:`PIPELINES`, or a config), then ``yaml_file``, then
    dotted ``overrides``; ``${root}`` interpolations resolved, every check run."""
    return build(_merged(preset, overrides, yaml_file), PIPELINE_CONFIG)


def show_pipeline(preset: Union[str, PipelineConfig, None], overrides: Optional[List[str]] = None,
                  yaml_file: Optional[str] = None) -> str:
    """The pipeline as YAML with its ``${root}`` interpolations kept (what ``--file`` reads back:
    ``root=...`` still moves every path), once every check passed."""
    from omegaconf import OmegaConf

    merged = _merged(preset, overrides, yaml_file)
    build(merged, PIPELINE_CONFIG)
    return OmegaConf.to_yaml(merged)


def _merged(preset, overrides, yaml_file):
    if isinstance(preset, PipelineConfig):
        base = preset
    elif preset is None:
        base = PipelineConfig
    else:
        base = PIPELINES.builder(preset)()
    return merge_layers(base, PIPELINE_CONFIG, overrides, yaml_file)


def pipeline_yaml(cfg: PipelineConfig) -> str:
    """The resolved pipeline as YAML (what ``--file`` reads back)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
