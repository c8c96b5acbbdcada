"""What one pipeline run is: nested dataclasses, a docstring under every field, checks in
``__post_init__`` (as :mod:`mopd.config`).

A pipeline trains Stage I and the Stage II arms, exports each, evaluates the systems and writes the
report, all under one ``root``. Paths may name the root as ``${root}`` (an OmegaConf interpolation:
``model: ${root}/pi0``), so ``root=...`` on the command line moves a whole preset. Named presets
are functions in :mod:`mopd.pipeline.presets`.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from mopd.config import ConfigError, RetrieverConfig, get_preset
from mopd.config.checks import choice as _choice
from mopd.config.checks import positive as _positive
from mopd.core.workflows import workflow_names
from mopd.pipeline.kinds import check_setup, report_kind

CHECKPOINTS = ("best", "last")
"""Which checkpoint a training stage exports: the best dev validation (the paper's model
selection; the last weights when no validation ran) or the last step."""
LAUNCHERS = ("inprocess", "subprocess")
SPLITS = ("test", "dev")


def _overrides(name: str, items: List[str]) -> None:
    for it in items:
        if "=" not in str(it):
            raise ConfigError(f"{name}: {it!r} is not a config override KEY=VALUE")


@dataclass
class DataPaths:
    train: str = ""
    """Training questions of every training stage (FlashRAG jsonl or Search-R1 parquet)."""
    dev: str = ""
    """Validation questions of every training stage (the checkpoint selection of ``export: best``,
    and the dev evaluation of ``eval.split: dev``); empty: no validation."""
    test: str = ""
    """Test questions: read once, by the evaluation, after every model is final."""


@dataclass
class TrainStageConfig:
    name: str = ""
    """The system this stage trains, as the report names it (``C-MAS + RL``, ``MultiAgent-OPD``)."""
    preset: str = ""
    """Its method preset (`mopd config list`): cmas_rl for Stage I, mopd and its ablations for Stage II."""
    dir: str = ""
    """Its run directory under the pipeline's root; the export is DIR/export."""
    steps: Optional[int] = None
    """Training steps (None: the preset's ``trainer.steps``)."""
    overrides: List[str] = field(default_factory=list)
    """Config overrides of this stage, after the pipeline's paths and before its ``overrides``."""
    export: str = "best"
    """The checkpoint that becomes the stage's model: best (best dev validation, the paper's model
    selection; the last when no validation ran) or last (the paper's Table 3 reads ablations there)."""
    label: str = ""
    """Its validation curve's label in the report (empty: ``name``)."""

    def check(self, where: str) -> None:
        if not self.name:
            raise ConfigError(f"{where}.name is empty: name the system this stage trains")
        try:
            get_preset(self.preset)
        except ConfigError:
            raise ConfigError(f"{where}.preset={self.preset!r} is not a method preset (`mopd config list`)") from None
        if not self.dir or self.dir.startswith("/") or ".." in self.dir.split("/"):
            raise ConfigError(f"{where}.dir={self.dir!r} must be a relative directory under the pipeline's root")
        if self.steps is not None:
            _positive(f"{where}.steps", self.steps)
        _choice(f"{where}.export", self.export, CHECKPOINTS)
        _overrides(f"{where}.overrides", self.overrides)


@dataclass
class SystemConfig:
    name: str = ""
    """The system's name in the evaluation records and the report."""
    model: str = "base"
    """Its model: base (the pipeline's ``model``), stage1, or the key of a Stage II arm (that
    stage's export)."""
    workflow: str = "cmas"
    """The workflow it is evaluated in: cmas (Searcher -> Answerer) or hmas (Leader -> Searchers -> Answerer)."""


@dataclass
class SetupStageConfig:
    kind: str = ""
    """A stage kind a recipe registers (:func:`mopd.pipeline.kinds.register_stage_kind`), e.g. the
    world and its base model: it builds what the training stages read."""
    settings: List[str] = field(default_factory=list)
    """Its settings as KEY=VALUE, read and checked by the kind."""


@dataclass
class EvalSettings:
    split: str = "test"
    """The split the systems are evaluated on: test (the final numbers, looked at once) or dev (every
    tuning choice)."""
    attempts: int = 4
    """Independent workflows per question (the paper: 4)."""
    questions: Optional[int] = None
    """Evaluate on the first N questions, taken round-robin over datasets (None: all)."""
    overrides: List[str] = field(default_factory=list)
    """Config overrides of every evaluation (after the evaluation presets cmas_base/hmas_base and the
    workflow limits of the training stages), e.g. rollout.engine=vllm."""
    dir: str = "eval"
    """Evaluations go to ROOT/DIR/<system>."""

    def __post_init__(self):
        _choice("eval.split", self.split, SPLITS)
        _positive("eval.attempts", self.attempts)
        if self.questions is not None:
            _positive("eval.questions", self.questions)
        _overrides("eval.overrides", self.overrides)


@dataclass
class TeacherCheckSettings:
    enabled: bool = True
    """Before the Stage II arms: the Stage-I export (their teacher) and the base model evaluated on
    the dev split in C-MAS, compared per dataset (question type), the table in the report and a
    warning where the teacher is worse than the base on a type a Searcher is distilled on
    (:mod:`mopd.pipeline.teacher_check`). Needs ``data.dev`` and a Stage II arm."""
    attempts: Optional[int] = None
    """Workflows per dev question (None: ``eval.attempts``)."""
    questions: Optional[int] = None
    """The first N dev questions, round-robin over datasets (None: all). With ``eval.split: dev``
    the check is the evaluation of the C-MAS base and Stage-I systems itself, at ``eval``'s
    attempts and questions (run before the arms, reused by the evaluation)."""
    dir: str = "teacher_check"
    """The check's evaluations and table go to ROOT/DIR."""

    def __post_init__(self):
        if self.attempts is not None:
            _positive("teacher_check.attempts", self.attempts)
        if self.questions is not None:
            _positive("teacher_check.questions", self.questions)
        if not self.dir or self.dir.startswith("/") or ".." in self.dir.split("/"):
            raise ConfigError(f"teacher_check.dir={self.dir!r} must be a relative directory under the pipeline's root")


@dataclass
class ReportSettings:
    kind: str = "eval"
    """A report kind (:mod:`mopd.pipeline.kinds`): eval (`mopd eval report`: metrics, paired intervals
    against ``reference``, costs, curves), or one a recipe registers."""
    dir: str = "report"
    """The report goes to ROOT/DIR."""
    reference: str = ""
    """The system every other is compared with (empty: the first Stage II arm's system)."""
    draws: int = 4000
    """Question-bootstrap draws."""
    title: str = "Evaluation report"
    """The report's heading (kind eval)."""

    def __post_init__(self):
        report_kind(self.kind)
        _positive("report.draws", self.draws)


def _flag(command: str, name: str) -> Optional[str]:
    """The value of torchrun's ``--NAME`` (or ``--NAME-WITH-DASHES``) in ``command``, if given."""
    words = shlex.split(command)
    for flag in (f"--{name}", f"--{name.replace('_', '-')}"):
        for i, w in enumerate(words):
            if w.startswith(flag + "="):
                return w.split("=", 1)[1]
            if w == flag and i + 1 < len(words):
                return words[i + 1]
    return None


@dataclass
class LauncherConfig:
    kind: str = "inprocess"
    """inprocess (every stage in this process and its spawned workers: CPU runs) or
    subprocess (each stage is its `mopd ...` command, started with the prefixes below: GPU runs)."""
    train: str = "mopd"
    """How a training stage's ``mopd`` starts (subprocess), e.g. ``torchrun --nproc_per_node 8 -m mopd``."""
    export: str = "mopd"
    """How an export's ``mopd`` starts (subprocess): one process, on the CPU."""
    eval: str = "mopd"
    """How an evaluation's ``mopd`` starts (subprocess); under torchrun (``torchrun --nproc_per_node 8
    -m mopd``) each rank evaluates a share of the questions with its own engine on its own GPU and
    rank 0 merges the records (``mopd/eval/ranks.py``: the records of one process)."""
    gpus: int = 1
    """GPUs a training stage runs on (the memory plan's world size)."""
    gpu_gib: float = 139.0
    """Memory of one GPU in GiB, for the memory plan (an H200: 139, an H100: 80)."""
    retriever_gib: float = 0.0
    """GiB a retriever served on the same GPUs holds on each (`mopd retriever serve --faiss-gpu`)."""
    arm_workers: int = 2
    """inprocess: Stage II arms trained at once (processes of one thread each; weights as with 1)."""
    eval_workers: int = 2
    """inprocess: evaluations run at once, and the workflows a setup stage runs in workers
    (processes of one thread each; records as with 1)."""
    lockstep: bool = True
    """inprocess: roll out with the lock-step scheduler, whose engine batches are a function of the
    runs' states (bit-reproducible), instead of the asynchronous one, whose batches depend on timing."""

    def __post_init__(self):
        _choice("launcher.kind", self.kind, LAUNCHERS)
        for name in ("train", "export", "eval"):
            words = shlex.split(getattr(self, name))
            if not words or words[-1] != "mopd":
                raise ConfigError(f"launcher.{name}={getattr(self, name)!r} must end with mopd "
                                  "(e.g. 'torchrun --nproc_per_node 8 -m mopd')")
        for name in ("gpus", "arm_workers", "eval_workers"):
            _positive(f"launcher.{name}", getattr(self, name))
        _positive("launcher.gpu_gib", self.gpu_gib)
        _positive("launcher.retriever_gib", self.retriever_gib, allow_zero=True)
        per_node, nodes = _flag(self.train, "nproc_per_node"), _flag(self.train, "nnodes") or "1"
        if per_node and per_node.isdigit() and nodes.isdigit() and int(per_node) * int(nodes) != self.gpus:
            raise ConfigError(f"launcher.train starts {int(per_node) * int(nodes)} processes ({nodes} node(s) x "
                              f"{per_node}) but launcher.gpus={self.gpus}: the memory plan needs the GPUs a stage "
                              "runs on")


@dataclass
class PipelineConfig:
    name: str = "custom"
    """The preset this pipeline came from (informational; the log's prefix)."""
    description: str = ""
    """What the pipeline runs, in a sentence."""
    root: str = "runs/pipeline"
    """Run directory: every stage writes under it."""
    model: str = ""
    """The base model pi_0 (a Hugging Face directory or a hub id in the cache): every stage trains
    from it, and the base systems are evaluated with it."""
    seed: int = 0
    """Seed of training and evaluation (``trainer.seed``, ``rollout.seed``) and of the setup stages."""
    data: DataPaths = field(default_factory=DataPaths)
    retriever: RetrieverConfig = field(default_factory=RetrieverConfig)
    """The retriever of every stage (its fields that differ from the defaults become overrides)."""
    setup: Dict[str, Optional[SetupStageConfig]] = field(default_factory=dict)
    """Stages that run before Stage I, by key (the stage's name), in order, in this process
    (``launcher.kind=inprocess``): a recipe's world and base model. Each reuses what it built. A key
    set to null drops a preset's stage (``setup.KEY=null``)."""
    overrides: List[str] = field(default_factory=list)
    """Config overrides of every training stage, applied last (e.g. trainer.lr=5e-4)."""
    stage1: TrainStageConfig = field(default_factory=TrainStageConfig)
    """Stage I (C-MAS, outcome RL) from ``model``; its export is the teacher of Stage II."""
    stage2: Dict[str, Optional[TrainStageConfig]] = field(default_factory=dict)
    """The Stage II arms, by key, in order: each from ``model`` with Stage I's export as teacher (a
    preset whose KL reference is not its teacher, base_teacher, distils from ``model`` and keeps
    Stage I as the reference). A key set to null drops a preset's arm (``stage2.prompted_critic=null``)."""
    systems: List[SystemConfig] = field(default_factory=list)
    """The systems evaluated, in the report's order."""
    eval: EvalSettings = field(default_factory=EvalSettings)
    teacher_check: TeacherCheckSettings = field(default_factory=TeacherCheckSettings)
    report: ReportSettings = field(default_factory=ReportSettings)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)

    def __post_init__(self):
        if not self.root:
            raise ConfigError("root is empty: set root=DIR")
        _overrides("overrides", self.overrides)
        self.setup = {k: v for k, v in self.setup.items() if v is not None}
        self.stage2 = {k: v for k, v in self.stage2.items() if v is not None}
        self.stage1.check("stage1")
        dirs = {self.stage1.dir: "stage1"}
        for key, arm in self.stage2.items():
            arm.check(f"stage2.{key}")
            if key == "stage1" or key == "base":
                raise ConfigError(f"stage2.{key}: 'base' and 'stage1' name other models; choose another key")
            if arm.dir in dirs:
                raise ConfigError(f"stage2.{key}.dir={arm.dir!r} is also {dirs[arm.dir]}'s run directory")
            dirs[arm.dir] = f"stage2.{key}"
        if not self.systems:
            raise ConfigError("systems is empty: name at least one system to evaluate")
        names = set()
        for i, s in enumerate(self.systems):
            if not s.name or s.name in names:
                raise ConfigError(f"systems[{i}].name={s.name!r} must be set and unique")
            names.add(s.name)
            _choice(f"systems[{i}].workflow", s.workflow, workflow_names())
            _choice(f"systems[{i}].model", s.model, ["base", "stage1", *self.stage2])
        if self.report.reference and self.report.reference not in names:
            raise ConfigError(f"report.reference={self.report.reference!r} is not one of the systems {sorted(names)}")
        if self.setup and self.launcher.kind != "inprocess":
            raise ConfigError(f"setup stages ({', '.join(self.setup)}) run in this process: they "
                              "need launcher.kind=inprocess")
        check_setup(self)

    def model_of(self, system: SystemConfig) -> str:
        """The model directory ``system`` is evaluated with (a stage's export, or the base model)."""
        if system.model == "base":
            return self.model
        stage = self.stage1 if system.model == "stage1" else self.stage2[system.model]
        return f"{self.root}/{stage.dir}/export"

    def reference_system(self) -> str:
        """The system the report compares every other with: ``report.reference``, else the system
        of the first Stage II arm, else the last system."""
        if self.report.reference:
            return self.report.reference
        first = next(iter(self.stage2), None)
        return next((s.name for s in self.systems if s.model == first), self.systems[-1].name)
