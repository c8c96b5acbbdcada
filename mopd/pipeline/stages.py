"""The pipeline's stages: what each reads and writes, when it is done, and its `mopd ...` command.

A stage is done when its marker holds its fingerprint (what it was built with); a second run
skips every done stage, and a stage killed half-way is started again and resumes (training from
its newest checkpoint, an evaluation from its records). :func:`plan` lists the stages of a
pipeline in order; nothing here loads a model or reads a question.

Markers: a training run's ``DONE`` holds ``"<steps> <config hash>"`` once trained and
``"<steps> <config hash> <best|last>"`` once exported (the layout the pipeline has always written,
so finished runs are reused); a LoRA Stage I's adapter export marks ``DONE.export_adapter`` the
same way; an evaluation's and the report's ``.done`` hold theirs.

Exports of a LoRA run (``model.lora.rank`` > 0): every training stage's ``DIR/export`` is the
adapter merged into its base, a plain Hugging Face model that the evaluations read as they read a
full run's; Stage I also writes its adapter alone to ``DIR/export_adapter`` (`mopd export
--adapter`), and that is the Stage II arms' teacher, so a LoRA arm scores its teacher as a view of
its own base (no second copy). A full fine-tuning pipeline's stages and commands are unchanged.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from mopd.config import Config, RetrieverConfig, resolve
from mopd.pipeline.config import PipelineConfig, SystemConfig, TrainStageConfig
from mopd.pipeline.kinds import report_kind, stage_kind
from mopd.pipeline.owner import check_live_owner
from dataclasses import fields
from functools import cached_property
from mopd.config import identity_yaml
from mopd.core.fingerprint import data_fingerprint, model_fingerprint
from mopd.core.run_models import RunModels

MARKER = "DONE"
"""A training run's marker (in its run directory)."""
ADAPTER_MARKER = "DONE.export_adapter"
"""A LoRA Stage I's adapter export's marker (in its run directory, beside ``DONE``)."""
ADAPTER_EXPORT = "export_adapter"
"""A LoRA Stage I's adapter export: DIR/export_adapter (its merged export stays DIR/export)."""
DONE = ".done"
"""An evaluation's and the report's marker (in their directories)."""
STARTED = ".stage"
"""In a training run's or an evaluation's directory: what the build there is of (its stage's
identity), written when it starts. A directory that holds another build (other settings, another
teacher) is moved aside to DIR.replaced-N before the stage starts, never resumed into or deleted."""
LIMIT_KEYS = ("max_input_tokens", "max_output_tokens", "max_steps", "max_rounds", "max_searchers_per_wave",
              "searcher_sees_question")
"""Workflow limits and the Searcher template an evaluation takes from the training stage of its
workflow: a system is evaluated in the workflow it was trained in."""


def move_aside(d: Path, log, why: str) -> Path:
    """Move ``d`` to the first free ``d.replaced-N`` (never deleted: it is someone's earlier work),
    saying so in one line; returns where it went."""
    n = 1
    while d.with_name(f"{d.name}.replaced-{n}").exists():
        n += 1
    aside = d.with_name(f"{d.name}.replaced-{n}")
    d.rename(aside)
    log(f"{d} {why}: moved to {aside}")
    return aside


OBSERVATION_ONLY = ("trace_every:", "trace_workflows:")
"""Trainer settings that change what a run writes for people to read, never what it trains
(``mopd.train.token_trace``): left out of its fingerprint, so a finished stage is reused whatever
they are, and fingerprints written before they existed still match."""


def fingerprinted_yaml(cfg: Config) -> str:
    """The resolved config as YAML, less the ``OBSERVATION_ONLY`` settings and the sections that are
    off (:func:`mopd.config.identity_yaml`: LoRA's settings with LoRA off)."""

    return "".join(line for line in identity_yaml(cfg).splitlines(keepends=True)
                   if not line.strip().startswith(OBSERVATION_ONLY))


def stage_fingerprint(cfg: Config) -> str:
    """What a finished training stage was trained with: its steps and the hash of its resolved config
    (:func:`fingerprinted_yaml`)."""
    return f"{cfg.trainer.steps} {hashlib.sha256(fingerprinted_yaml(cfg).encode()).hexdigest()[:16]}"


def _hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def read_marker(path: Path) -> Optional[str]:
    return path.read_text().strip() if path.is_file() else None


def _value(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def retriever_overrides(r: RetrieverConfig) -> List[str]:
    """The pipeline's retriever as overrides: its kind, its index (inprocess) or URL (http), and each
    other field that differs from the default."""

    default, named = RetrieverConfig(), "url" if r.kind == "http" else "index"
    return [f"retriever.kind={r.kind}"] + [f"retriever.{f.name}={_value(getattr(r, f.name))}" for f in fields(r)
                                           if f.name != "kind" and (f.name == named
                                                                    or getattr(r, f.name) != getattr(default, f.name))]


def mopd_words(launcher: str) -> List[str]:
    """A launcher prefix as words (``torchrun --nproc_per_node 8 -m mopd``)."""
    return shlex.split(launcher)


@dataclass
class Stage:
    """One step of the pipeline."""

    key: str
    """Unique name: a setup stage's (a recipe's: world, pi0, ...), stage1, stage1.export, stage2.<arm>,
    eval.<system>, report."""
    group: str
    """The step it belongs to (its time in timings.json): a setup stage's, stage1, stage2, eval, report."""
    title: str
    """What it does, in words."""
    inputs: List[str] = field(default_factory=list)
    outputs: List[str] = field(default_factory=list)

    def fingerprint(self) -> str:
        return ""

    def done(self) -> bool:
        """Whether a finished earlier run of this stage can be reused."""
        return False

    def mark_done(self) -> None:
        pass

    def command(self, cfg: PipelineConfig) -> List[str]:
        """The command line that runs this stage (the subprocess launcher runs it as is)."""
        return []

    def directory(self) -> Optional[Path]:
        """The directory this stage builds in and owns (None: a stage that keeps its own cache)."""
        return None

    def identity(self) -> str:
        """What the build in :meth:`directory` is of (see :data:`STARTED`)."""
        return self.fingerprint()

    def begin(self, log) -> None:
        """Before the stage runs: a directory holding another build is moved aside; then this
        stage's identity is written there (a killed build of the same stage is resumed)."""
        d = self.directory()
        if d is None:
            return
        started = read_marker(d / STARTED)
        if started is not None and started != self.identity():
            move_aside(d, log, "holds a build of other settings or inputs")
        d.mkdir(parents=True, exist_ok=True)
        (d / STARTED).write_text(self.identity())

    def seconds_built(self) -> Optional[float]:
        """Seconds its build took where it recorded them itself (a setup stage reused from a build
        outside the pipeline); None: the pipeline's own timing holds."""
        return None

    def report_inputs(self) -> List[str]:
        """Files of this stage the report reads (a setup stage's check, say)."""
        return []

    def disk(self) -> str:
        """What it writes, in words (the dry run's disk line of a stage the memory plan does not size)."""
        return "its files"

    def built_here(self) -> bool:
        """Whether the build in :meth:`directory` is this stage's (or predates these records)."""
        d = self.directory()
        started = read_marker(d / STARTED) if d is not None else None
        return started is None or started == self.identity()


@dataclass
class TrainStage(Stage):
    """A training run (`mopd train --resume-or-start`): resumes from its newest checkpoint."""

    spec: TrainStageConfig = field(default_factory=TrainStageConfig)
    config: Optional[Config] = None
    """The resolved run config."""
    overrides: List[str] = field(default_factory=list)
    """The overrides that resolve ``config`` from ``spec.preset``."""
    planned_adapters: List[str] = field(default_factory=list)
    """Paths an earlier stage writes an adapter to (a LoRA Stage I's, this stage's teacher)."""

    @property
    def run_dir(self) -> Path:
        return Path(self.config.trainer.out_dir)

    @cached_property
    def models(self) -> RunModels:
        """The run's models (:class:`mopd.core.run_models.RunModels`), the planned adapters known;
        built once per stage (the footprint and the plan ask it several times)."""
        return RunModels.from_config(self.config, planned_adapters=self.planned_adapters)

    def fingerprint(self) -> str:
        return stage_fingerprint(self.config)

    def identity(self) -> str:
        """The fingerprint and the weights and data it trains from (the base model, a teacher, a
        reference: a retrained Stage I is a new teacher under the same path)."""

        c = self.config
        models = [c.model.path, c.teacher.path, c.reference.path]
        return _hash({"fingerprint": self.fingerprint(),
                      "models": [model_fingerprint(p)["weights"] if p else None for p in models],
                      "data": [data_fingerprint(p)["content"] for p in (c.data.train, c.data.dev)]})

    def directory(self) -> Path:
        return self.run_dir

    def done(self) -> bool:
        marker = read_marker(self.run_dir / MARKER)
        return (marker is not None and (marker == self.fingerprint() or marker.startswith(self.fingerprint() + " "))
                and self.built_here())

    def mark_done(self) -> None:
        check_live_owner(self.key)
        if not self.done():
            (self.run_dir / MARKER).write_text(self.fingerprint())

    def command(self, cfg):
        return mopd_words(cfg.launcher.train) + ["train", "--resume-or-start", self.spec.preset, *self.overrides]


@dataclass
class ExportStage(Stage):
    """A training run's chosen checkpoint as a Hugging Face model (`mopd export`), or, with
    ``adapter``, a LoRA run's adapter alone (`mopd export --adapter`: Stage II's teacher)."""

    train: Optional[TrainStage] = None
    which: str = "best"
    adapter: bool = False
    """Write the adapter alone in PEFT's format to DIR/export_adapter (a LoRA run only)."""

    @property
    def export_dir(self) -> Path:
        return self.train.run_dir / (ADAPTER_EXPORT if self.adapter else "export")

    @property
    def marker(self) -> Path:
        return self.train.run_dir / (ADAPTER_MARKER if self.adapter else MARKER)

    def fingerprint(self) -> str:
        return f"{self.train.fingerprint()} {self.which}"

    def done(self) -> bool:
        written = self.export_dir / ("adapter_config.json" if self.adapter else "config.json")
        return written.is_file() and read_marker(self.marker) == self.fingerprint() and self.train.built_here()

    def mark_done(self) -> None:
        check_live_owner(self.key)
        self.marker.write_text(self.fingerprint())

    def command(self, cfg):
        return mopd_words(cfg.launcher.export) + ["export", str(self.train.run_dir), "--checkpoint",
                                                  "best" if self.which == "best" else "latest",
                                                  *(["--adapter"] if self.adapter else []),
                                                  "--out", str(self.export_dir)]


@dataclass
class EvalStage(Stage):
    """One system's evaluation (`mopd eval run`): K workflows per question, resumable from its records."""

    system: SystemConfig = field(default_factory=SystemConfig)
    model_dir: str = ""
    config: Optional[Config] = None
    """The resolved evaluation config (rollout limits of the workflow's training stage)."""
    preset: str = ""
    overrides: List[str] = field(default_factory=list)
    manifest: str = ""
    """The evaluated split's file (read only when the evaluation starts)."""
    questions: Optional[int] = None
    """The first N questions round-robin over datasets (None: all)."""
    attempts: int = 4

    @property
    def out(self) -> Path:
        return Path(self.outputs[0])

    def fingerprint(self) -> str:
        """The evaluation's command, its model's weights and the manifest's size and time (a stat:
        nothing reads the evaluated split before the evaluation)."""

        m = Path(self.manifest)
        stat = [m.stat().st_size, m.stat().st_mtime_ns] if m.is_file() else None
        return _hash({"config": fingerprinted_yaml(self.config), "workflow": self.system.workflow, "method": self.system.name,
                      "attempts": self.attempts, "questions": self.questions, "manifest": [self.manifest, stat],
                      "model": model_fingerprint(self.model_dir)})

    def done(self) -> bool:
        return (self.out / "records.jsonl").is_file() and read_marker(self.out / DONE) == self.fingerprint()

    def mark_done(self) -> None:
        check_live_owner(self.key)
        (self.out / DONE).write_text(self.fingerprint())

    def directory(self) -> Path:
        return self.out

    def command(self, cfg):
        manifest = self.manifest if self.questions is None else str(self.out.parent / "questions.jsonl")
        return mopd_words(cfg.launcher.eval) + [
            "eval", "run", "--model", self.model_dir, "--workflow", self.system.workflow, "--manifest", manifest,
            "--attempts", str(self.attempts), "--out", str(self.out), "--method", self.system.name,
            "--preset", self.preset, *self.overrides]


@dataclass
class ReportStage(Stage):
    """The report of every evaluation, by the writer its kind names (:mod:`mopd.pipeline.kinds`)."""

    names: List[str] = field(default_factory=list)
    evals: List[EvalStage] = field(default_factory=list)
    logs: List[str] = field(default_factory=list)
    labels: List[str] = field(default_factory=list)
    kind: str = "eval"
    reference: str = ""
    draws: int = 4000
    heading: str = ""
    """The report's heading (kind eval)."""
    setup_files: List[str] = field(default_factory=list)
    """Files the setup stages wrote that the report reads (their content is part of its fingerprint)."""
    dev: bool = False
    """The systems were evaluated on the dev split (the tuning path)."""
    sections: List[str] = field(default_factory=list)
    """Markdown files the report places at its top (the teacher check's table:
    :mod:`mopd.pipeline.teacher_check`, which also lists them in ``setup_files``, so that their
    content is fingerprinted)."""

    @property
    def out(self) -> Path:
        return Path(self.outputs[0])

    def fingerprint(self) -> str:
        setup = [Path(f).read_text() if Path(f).is_file() else None for f in self.setup_files]
        return _hash({"evals": [read_marker(e.out / DONE) for e in self.evals], "names": self.names, "dev": self.dev,
                      "kind": self.kind, "reference": self.reference, "draws": self.draws, "heading": self.heading,
                      "logs": [read_marker(Path(p).parent / MARKER) for p in self.logs], "setup": setup})

    def done(self) -> bool:
        return (self.out / "report.md").is_file() and read_marker(self.out / DONE) == self.fingerprint()

    def mark_done(self) -> None:
        check_live_owner(self.key)
        (self.out / DONE).write_text(self.fingerprint())

    def command(self, cfg):
        if self.kind != "eval":
            writer = report_kind(self.kind)
            return ["(in-process)", f"{writer.__module__}.{writer.__name__}", *[str(e.out) for e in self.evals],
                    "--out", str(self.out)]
        return ["mopd", "eval", "report", *[str(e.out) for e in self.evals], "--names", *self.names,
                "--reference", self.reference, "--draws", str(self.draws), "--title", self.heading,
                *[w for f in self.sections for w in ("--section", f)], "--out", str(self.out), "--val-log", *self.logs]


# --------------------------------------------------------------------------------------------
# The stages of a pipeline
# --------------------------------------------------------------------------------------------


def train_overrides(cfg: PipelineConfig, spec: TrainStageConfig, teacher: str = "") -> List[str]:
    """A training stage's overrides: the pipeline's model, data, retriever, run directory, steps and
    seeds (and the teacher of a Stage II arm), then the stage's own, then the pipeline's."""
    o = [f"model.path={cfg.model}", f"data.train={cfg.data.train}", f"data.dev={cfg.data.dev}",
         *retriever_overrides(cfg.retriever), f"trainer.out_dir={Path(cfg.root) / spec.dir}"]
    if spec.steps is not None:
        o.append(f"trainer.steps={spec.steps}")
    o += [f"trainer.seed={cfg.seed}", f"rollout.seed={cfg.seed}"]
    if teacher:
        o.append(f"teacher.path={teacher}")
    return o + list(spec.overrides) + list(cfg.overrides)


def _train_stage(cfg: PipelineConfig, key: str, group: str, spec: TrainStageConfig, teacher: str = "",
                 teacher_is_adapter: bool = False) -> TrainStage:
    overrides = train_overrides(cfg, spec, teacher)
    run_cfg = resolve(spec.preset, overrides)
    inputs = [cfg.model, cfg.data.train] + ([cfg.data.dev] if cfg.data.dev else [])
    if teacher:
        if not run_cfg.reference.from_teacher:
            # base_teacher: OPD from pi_0, the Stage-I model stays the Leader's and Answerer's KL reference
            overrides += [f"teacher.path={cfg.model}", f"reference.path={teacher}"]
            run_cfg = resolve(spec.preset, overrides)
        inputs.append(teacher)
    title = f"{spec.name}: train {spec.preset}, {run_cfg.trainer.steps} steps"
    return TrainStage(key=key, group=group, title=title, inputs=inputs, outputs=[run_cfg.trainer.out_dir],
                      spec=spec, config=run_cfg, overrides=overrides,
                      planned_adapters=[teacher] if teacher and teacher_is_adapter else [])


def is_lora(train: TrainStage) -> bool:
    """Whether a training stage trains LoRA adapters over a frozen base (``RunModels.trains_adapters``)."""
    return train.models.trains_adapters


def _export_stage(train: TrainStage, adapter: bool = False) -> ExportStage:
    which = train.spec.export
    what = f"the {'best-validation' if which == 'best' else 'last'} checkpoint"
    title = (f"{train.spec.name}: export {what}'s adapter alone (the teacher)" if adapter else
             f"{train.spec.name}: export {what}" + (" (adapter merged into the base)" if is_lora(train) else ""))
    key = f"{train.key}.{ADAPTER_EXPORT}" if adapter else f"{train.key}.export"
    out = train.run_dir / (ADAPTER_EXPORT if adapter else "export")
    return ExportStage(key=key, group=train.group, title=title, inputs=[str(train.run_dir)], outputs=[str(out)],
                       train=train, which=which, adapter=adapter)


def slug(name: str) -> str:
    """A system's directory name (``C-MAS + RL`` -> ``c_mas_plus_rl``)."""
    return name.lower().replace(" ", "_").replace("+", "plus").replace("-", "_")


def _eval_stage(cfg: PipelineConfig, system: SystemConfig, limits: Optional[Config]) -> EvalStage:
    preset = f"{system.workflow}_base"
    o = [f"model.path={cfg.model_of(system)}", f"eval.attempts={cfg.eval.attempts}", f"rollout.seed={cfg.seed}",
         *retriever_overrides(cfg.retriever)]
    if limits is not None:
        own = resolve(preset, o)
        o += [f"rollout.{k}={_value(getattr(limits.rollout, k))}" for k in LIMIT_KEYS
              if getattr(limits.rollout, k) != getattr(own.rollout, k)]
    o += list(cfg.eval.overrides)
    manifest = cfg.data.dev if cfg.eval.split == "dev" else cfg.data.test
    out = Path(cfg.root) / cfg.eval.dir / slug(system.name)
    size = f"{cfg.eval.questions} " if cfg.eval.questions else ""
    title = (f"{system.name}: evaluate {system.workflow}, {size}{cfg.eval.split} questions x {cfg.eval.attempts} "
             "attempts")
    return EvalStage(key=f"eval.{slug(system.name)}", group="eval", title=title,
                     inputs=[cfg.model_of(system), manifest], outputs=[str(out)], system=system,
                     model_dir=cfg.model_of(system), config=resolve(preset, o), preset=preset, overrides=o,
                     manifest=manifest, questions=cfg.eval.questions, attempts=cfg.eval.attempts)


def plan(cfg: PipelineConfig) -> List[Stage]:
    """Every stage of ``cfg``, in the order they run (resolving each stage's config; nothing loads),
    but the teacher check, which the runner inserts before the arms
    (:func:`mopd.pipeline.teacher_check.plan_with_check`)."""
    root = Path(cfg.root)
    setup: List[Stage] = [stage_kind(s.kind).build(cfg, key, list(s.settings)) for key, s in cfg.setup.items()]
    stages: List[Stage] = list(setup)
    stage1 = _train_stage(cfg, "stage1", "stage1", cfg.stage1)
    stages += [stage1, _export_stage(stage1)]
    teacher = str(stage1.run_dir / "export")
    adapter_teacher = is_lora(stage1)
    if adapter_teacher:   # the teacher is the adapter alone; the evaluation reads the merged export
        stages.append(_export_stage(stage1, adapter=True))
        teacher = str(stage1.run_dir / ADAPTER_EXPORT)
    arms = [_train_stage(cfg, f"stage2.{k}", "stage2", spec, teacher, adapter_teacher)
            for k, spec in cfg.stage2.items()]
    for arm in arms:
        stages += [arm, _export_stage(arm)]
    limits = {"cmas": stage1.config, "hmas": arms[0].config if arms else None}
    evals = [_eval_stage(cfg, s, limits.get(s.workflow)) for s in cfg.systems]
    stages += evals
    trains = [stage1] + arms
    report_dir = root / cfg.report.dir
    setup_files = [f for s in setup for f in s.report_inputs()]
    stages.append(ReportStage(
        "report", "report", f"the report ({'mopd eval report' if cfg.report.kind == 'eval' else cfg.report.kind})",
        inputs=[str(e.out) for e in evals], outputs=[str(report_dir)], names=[s.name for s in cfg.systems],
        evals=evals, logs=[str(t.run_dir / "metrics.jsonl") for t in trains],
        labels=[t.spec.label or t.spec.name for t in trains], kind=cfg.report.kind,
        reference=cfg.reference_system(), draws=cfg.report.draws, heading=cfg.report.title, setup_files=setup_files,
        dev=cfg.eval.split == "dev"))
    return stages
