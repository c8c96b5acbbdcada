"""Run a pipeline: every stage in order, a done one reused, a killed one resumed; or, with
``--dry-run``, only say what would run, where, with what memory and disk.

The in-process launcher runs the stages here (the Stage II arms and the evaluations in spawned
workers); the subprocess launcher runs each stage's `mopd ...` command (training under its
``launcher.train`` prefix, e.g. torchrun) and marks it done when the command succeeds.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from mopd.core.errors import UserError
from mopd.pipeline.config import PipelineConfig
from mopd.pipeline.log import logger
from mopd.pipeline.kinds import STAGE_KINDS, report_kind
from mopd.pipeline.stages import EvalStage, ExportStage, ReportStage, Stage, TrainStage
from mopd.pipeline.teacher_check import TeacherCheckStage, plan_with_check
from mopd.core.model_dir import hub_snapshot, remote_code_problem, trust_remote_code
from mopd.core.qa import load_questions
from mopd.core.qa import write_questions
from mopd.core.reproducible import deterministic_torch, environment_record
from mopd.core.parent_death import parent_death_signal
from mopd.core.run_lock import RunLock, RunLocked
from mopd.pipeline.owner import hold
from mopd.pipeline.footprint import footprint, human_bytes
from mopd.pipeline.presets import pipeline_yaml


class PipelineError(UserError):
    """A stage's command failed (one line: the stage, its exit status and its command)."""


def eval_questions(cfg: PipelineConfig):
    """The questions of the evaluation: the only place the pipeline reads the evaluated split."""

    manifest = cfg.data.dev if cfg.eval.split == "dev" else cfg.data.test
    questions, _ = load_questions(manifest)
    if cfg.eval.questions is not None:
        questions = spread_over_datasets(questions, cfg.eval.questions)
    return questions


def stage_questions(stage: EvalStage):
    """The questions an evaluation stage reads: its manifest's, the first ``stage.questions``
    round-robin over datasets when set (:func:`eval_questions`' for the pipeline's evaluations)."""
    questions, _ = load_questions(stage.manifest)
    return questions if stage.questions is None else spread_over_datasets(questions, stage.questions)


def _manifest_of(stage: EvalStage, cfg: PipelineConfig) -> Path:
    words = stage.command(cfg)
    return Path(words[words.index("--manifest") + 1])


def _first_of_manifest(stage: EvalStage, evals: List[EvalStage], cfg: PipelineConfig) -> EvalStage:
    """The first evaluation that reads the same written questions file as ``stage`` (it writes it)."""
    return next(e for e in evals if e.questions is not None and _manifest_of(e, cfg) == _manifest_of(stage, cfg))


def spread_over_datasets(questions, n: int):
    """The first ``n`` questions taken round-robin over datasets (so a short run sees every dataset)."""
    by: Dict[str, list] = {}
    for q in questions:
        by.setdefault(q.dataset, []).append(q)
    out, i = [], 0
    while len(out) < min(n, len(questions)):
        for qs in by.values():
            if i < len(qs) and len(out) < n:
                out.append(qs[i])
        i += 1
    return out


def local_base_model(cfg: PipelineConfig, stages: List[Stage]) -> Optional[str]:
    """Point the evaluations of the base model at a local directory (`mopd eval run` reads files, not
    a hub id): ``cfg.model`` itself, or its Hugging Face cache snapshot. Returns why that is not
    possible (None when it is, or when no evaluation needs it)."""
    evals = [s for s in stages if isinstance(s, EvalStage) and s.system.model == "base"]
    if not evals or Path(cfg.model).expanduser().is_dir():
        return None
    snapshot = hub_snapshot(cfg.model)
    if snapshot is None:
        return (f"model={cfg.model} is neither a local directory nor in the Hugging Face cache, and `mopd eval "
                f"run` reads the base model's files: `hf download {cfg.model}` (or --local-dir DIR and model=DIR)")
    for s in evals:
        s.model_dir = s.inputs[0] = str(snapshot)
    return None


# --------------------------------------------------------------------------------------------
# --dry-run
# --------------------------------------------------------------------------------------------


def describe(cfg: PipelineConfig, stages: Optional[List[Stage]] = None) -> str:
    """Every stage with its status, command, memory per GPU and disk, and the disk in all;
    nothing is loaded or run."""

    stages = stages if stages is not None else plan_with_check(cfg)
    missing = local_base_model(cfg, stages) if cfg.launcher.kind == "subprocess" else None
    L = cfg.launcher
    where = (f"subprocess launcher; training on {L.gpus} GPU(s) of {L.gpu_gib:.0f} GiB"
             + (f", {L.retriever_gib:g} GiB each held by the retriever" if L.retriever_gib else "")
             if L.kind == "subprocess" else "in-process launcher (CPU)")
    lines = [f"pipeline {cfg.name}: {len(stages)} stages under {cfg.root} ({where})"]
    total, unknown = 0.0, []
    for i, s in enumerate(stages, 1):
        f = footprint(s, cfg)
        lines.append(f"[{i}/{len(stages)}] {s.key}: {s.title} ({'done: reused' if s.done() else 'to run'})")
        lines.append(f"    command: {command_text(s.command(cfg))}")
        lines.append(f"    memory per GPU: {f.memory}")
        lines.append(f"    disk: small ({f.disk})" if f.small else f"    disk: {human_bytes(f.disk_bytes)} ({f.disk})")
        if f.disk_bytes is not None:
            total += f.disk_bytes
        elif isinstance(s, (TrainStage, ExportStage)):
            unknown.append(s.key)
    lines.append(f"disk in all: {human_bytes(total)} under {cfg.root}"
                 + (f", plus {', '.join(unknown)} (model size unknown)" if unknown else ""))
    if missing:
        lines.append(f"the run would stop before its first stage: {missing}")
    return "\n".join(lines)


def command_text(words: List[str]) -> str:
    """A stage's command as a shell line (an in-process step: the function it calls)."""
    if words and words[0] == "(in-process)":
        return f"in-process: {words[1]}(" + ", ".join(words[2:]) + ")"
    return shlex.join(words)


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------


def run_pipeline(cfg: PipelineConfig) -> Path:
    """Run every stage of ``cfg`` (reusing done ones, resuming a killed one); returns the report's path."""


    stages = plan_with_check(cfg)
    check_remote_code(cfg, stages)
    root = Path(cfg.root)
    try:   # one pipeline per root: a second one would train the same stages into the same directories
        lock = RunLock(root, f"mopd pipeline {cfg.name}")
    except RunLocked as e:
        raise PipelineError(str(e).replace("one process writes a run", "one pipeline runs in a root")) from None
    try:
        (root / "pipeline.yaml").write_text(pipeline_yaml(cfg))
        with hold(lock):        # its stages are marked done only while it lives and holds the lock
            if cfg.launcher.kind == "inprocess":
                return _InProcess(cfg, stages).run()
            return _Subprocess(cfg, stages).run()
    finally:
        lock.release()


def check_remote_code(cfg: PipelineConfig, stages: List[Stage]) -> None:
    """Refuse a base model, teacher or reference directory that needs its own code unless the
    training stages set ``model.trust_remote_code=true`` (which then holds for the whole pipeline,
    its workers and stage processes)."""

    trains = [s.config for s in stages if isinstance(s, TrainStage)]
    trusted = bool(trains) and all(c.model.trust_remote_code for c in trains)
    trust_remote_code(trusted)
    paths = [cfg.model] + [p for c in trains for p in (c.model.path, c.teacher.path, c.reference.path)]
    for p in dict.fromkeys(p for p in paths if p):
        if Path(p).expanduser().is_dir() and remote_code_problem(Path(p).expanduser(), trusted):
            raise PipelineError(f"model {p} {remote_code_problem(Path(p).expanduser(), trusted)}")


def _by_type(stages: List[Stage], kind) -> List:
    return [s for s in stages if isinstance(s, kind)]


def _jobs(stages: List[Stage], group: str) -> List[tuple]:
    """(train stage, its exports) of a group, in order (a LoRA Stage I has two: merged and adapter)."""
    exports: Dict[str, list] = {}
    for s in stages:
        if isinstance(s, ExportStage):
            exports.setdefault(s.train.key, []).append(s)
    return [(s, exports.get(s.key, [])) for s in stages if isinstance(s, TrainStage) and s.group == group]


class _Timed:
    """Stage-group times, written to ROOT/timings.json at the end (see :func:`write_timings`)."""

    def __init__(self, cfg: PipelineConfig, stages: List[Stage]):
        self.cfg, self.stages, self.root = cfg, stages, Path(cfg.root)
        self.log = logger(cfg.name)
        self.times: Dict[str, float] = {}
        self.t_start, self.started = time.perf_counter(), time.time()

    def timed(self, group: str, fn, *args):
        t = time.perf_counter()
        out = fn(*args)
        self.times[group] = time.perf_counter() - t
        return out

    def finish(self, report: Path) -> Path:
        self.times["total"] = time.perf_counter() - self.t_start
        rebuilt = {}
        for s in _by_type(self.stages, TrainStage):
            rebuilt[s.group] = rebuilt.get(s.group, False) or _written_since(s.run_dir / "DONE", self.started)
        built = {s.group: t for s in setup_stages(self.stages) if (t := s.seconds_built()) is not None}
        write_timings(self.root / "timings.json", self.times, built=built, rebuilt=rebuilt)
        self.log(f"finished in {self.times['total'] / 60:.1f} min; report: {report}")
        return report


class _InProcess(_Timed):
    """Every stage in this process (and its spawned workers)."""

    def run(self) -> Path:

        cfg, root = self.cfg, self.root
        deterministic_torch(1)
        (root / "environment.json").write_text(json.dumps(environment_record(), indent=2))
        setup_results = {s.key: self.timed(s.group, s.run, self) for s in setup_stages(self.stages)}
        # The in-process launcher trains here: torch and the trainer load now, not when the
        # pipeline module is imported (a subprocess-launched run never loads them).
        from mopd.pipeline import inprocess

        self.retriever = inprocess.open_retriever(self.cfg.retriever)
        L = cfg.launcher

        self.timed("stage1", lambda: [inprocess.train(t, e, self.retriever, L.lockstep, self.log)
                                      for t, e in _jobs(self.stages, "stage1")])
        for check in _by_type(self.stages, TeacherCheckStage):   # the teacher on dev, before it teaches
            self.timed("teacher_check", self._teacher_check, check)
        arms = _jobs(self.stages, "stage2")
        if arms:
            self.timed("stage2", inprocess.train_side_by_side, arms, L.arm_workers, self.retriever, cfg.retriever,
                       L.lockstep, self.log, cfg.name)
        evals = [e for e in _by_type(self.stages, EvalStage) if e.group == "eval"]

        def evaluate():
            # The evaluated split is read here, after every model is final.
            import mopd.pipeline.run as this

            questions = this.eval_questions(cfg)
            inprocess.evaluate_all(evals, questions, L.eval_workers, self.retriever, cfg.retriever, L.lockstep,
                                   self.log, cfg.name)

        self.timed("eval", evaluate)
        report = _render_report(_by_type(self.stages, ReportStage)[0], setup_results, self.log)
        return self.finish(report)

    def _teacher_check(self, check: TeacherCheckStage) -> dict:
        """The check's two evaluations on dev (side by side), then its comparison."""
        from mopd.pipeline import inprocess

        L = self.cfg.launcher
        inprocess.evaluate_all([check.base, check.teacher], stage_questions(check.base), L.eval_workers,
                               self.retriever, self.cfg.retriever, L.lockstep, self.log, self.cfg.name)
        return check.run(self.log)



def setup_stages(stages: List[Stage]) -> List[Stage]:
    """The setup stages (a recipe's kinds, :mod:`mopd.pipeline.kinds`), in order."""
    kinds = tuple(STAGE_KINDS.values())
    return [s for s in stages if isinstance(s, kinds)]


def _render_report(stage: ReportStage, setup_results: Dict[str, object], log) -> Path:
    """The report of every evaluation (reused when its evaluations and settings are unchanged), by
    the writer its kind names; ``setup_results``: what each setup stage returned, by its key."""
    if stage.done():
        log(f"report: reusing {stage.out}")
        return stage.out / "report.md"
    path = report_kind(stage.kind)(stage, setup_results, log)
    stage.mark_done()
    return path


class _Subprocess(_Timed):
    """Each stage's command in its own process (training under ``launcher.train``)."""

    def run(self) -> Path:
        missing = local_base_model(self.cfg, self.stages)
        if missing:   # before days of training, not after
            raise PipelineError(missing)
        self.log(describe(self.cfg, self.stages).splitlines()[0])
        evals, setup = _by_type(self.stages, EvalStage), setup_stages(self.stages)
        for s in self.stages:
            if s in setup:
                raise PipelineError(f"stage {s.key} runs only in-process (launcher.kind=inprocess)")
            if isinstance(s, ReportStage):
                report = self.timed("report", self._report if s.kind == "eval" else _render_report, s, {}, self.log)
                continue
            t = time.perf_counter()
            if isinstance(s, TeacherCheckStage):
                s.run(self.log)   # reads two evaluations' records, in this process
            elif s.done():
                self.log(f"{s.key}: done, reusing {s.outputs[0]}")
            else:
                if isinstance(s, EvalStage) and s.questions is not None and s is _first_of_manifest(s, evals, self.cfg):
                    self._write_questions(s)
                s.begin(self.log)
                self._call(s)
                s.mark_done()
            self.times[s.group] = self.times.get(s.group, 0.0) + time.perf_counter() - t
        return self.finish(report)

    def _write_questions(self, stage: EvalStage) -> None:
        """The evaluated questions (the first N round-robin over datasets) as the manifest every
        evaluation of the same questions reads."""
        write_questions(_manifest_of(stage, self.cfg), stage_questions(stage))

    def _report(self, stage: ReportStage, setup_results, log) -> Path:
        if stage.done():
            log(f"report: reusing {stage.out}")
        else:
            self._call(stage)
            stage.mark_done()
        return stage.out / "report.md"

    def _call(self, stage: Stage) -> None:
        words = stage.command(self.cfg)
        run = [sys.executable, "-m", "mopd", *words[1:]] if words[0] == "mopd" else words
        self.log(f"{stage.key}: {stage.title}: {shlex.join(words)}")
        rc = subprocess.call(run, preexec_fn=parent_death_signal(signal.SIGTERM))   # it ends if this process is killed
        if rc != 0:
            raise PipelineError(f"stage {stage.key} failed (exit {rc}): {shlex.join(words)}; "
                                "run `mopd pipeline` again to resume it")


# --------------------------------------------------------------------------------------------
# timings.json
# --------------------------------------------------------------------------------------------


def _written_since(path: Path, t: float) -> bool:
    """Whether ``path`` exists and was written at or after wall time ``t`` (a stage built by this run)."""
    return path.is_file() and path.stat().st_mtime >= t - 1.0


def write_timings(path: Path, times: Dict[str, float], built: Optional[Dict[str, float]] = None,
                  rebuilt: Optional[Dict[str, bool]] = None) -> None:
    """Stage seconds of the run that built each stage, and under ``last_run`` this run's own: a
    re-run reuses finished stages in a moment, so where an earlier run of this directory took
    longer for a stage, its time is kept at the top level (what the published tables report),
    unless ``rebuilt`` says this run built that stage again (other steps, say): then this run's
    time replaces the old one. ``built``: stage seconds recorded where a stage was built outside a
    pipeline run (a setup stage reused from its own earlier build). The top-level total is at least the
    sum of the stages."""
    old = json.loads(path.read_text()) if path.is_file() else {}
    built, rebuilt = built or {}, rebuilt or {}
    merged = {k: round(v if rebuilt.get(k) else max(v, float(old.get(k, 0.0)), float(built.get(k, 0.0))), 1)
              for k, v in times.items()}
    if "total" in merged:
        merged["total"] = round(max(merged["total"], sum(v for k, v in merged.items() if k != "total")), 1)
        if any(rebuilt.values()):
            merged["total"] = round(sum(v for k, v in merged.items() if k != "total"), 1)
    merged["last_run"] = {k: round(v, 1) for k, v in times.items()}
    path.write_text(json.dumps(merged, indent=2))
