"""`mopd demo`: the whole method end to end on the built-in tiny world, on a laptop CPU.

world -> retrieval index -> pi_0 (SFT warm start, 2 threads) -> Stage I (tiny_cmas_rl, 2 threads)
-> export as teacher -> Stage II arms from pi_0, side by side in processes of one thread
(tiny_mopd and its control tiny_no_searcher_supervision; with ablations also tiny_outcome_searcher
and tiny_base_teacher), each exported at its last step -> evaluation of C-MAS base, C-MAS + RL,
H-MAS base and every arm with the paper's protocol (4 attempts, question bootstrap) -> report
with plots and claims.
Every step reuses what an earlier run already built in the same directory (world, pi_0, finished
stages, finished evaluations), so a second run is quick and a killed run resumes. What the report
says, and the multi-seed summary, are rendered by :mod:`mopd.demo_report`.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from mopd.config import Config, resolve
from mopd.demo_report import ReportInputs, log as _log, write_report, write_seed_summary


@dataclass
class DemoSettings:
    out: str = "runs/demo"
    """Run directory; everything the demo builds lands here."""
    seed: int = 0
    """Seed of the world, pi_0 and training."""
    pi0_steps: Optional[int] = None
    """SFT steps of the warm start (None: the warm-start recipe's default)."""
    stage1_steps: int = 15
    """Stage I (C-MAS) training steps (15: seed 0's Stage I peaked on dev at step 15 of 20 with the
    chain-only world, and the demo must fit 25 minutes with a second Stage II arm)."""
    stage2_steps: int = 10
    """Stage II (H-MAS) training steps, every arm alike (10: on seed 0's dev split, with 15 steps,
    MultiAgent-OPD's dev EM was 50.0% at steps 5 and 10 and 45.0% at 15, the control's 40.6-45.0%
    throughout; 10 also keeps the demo within 25 minutes)."""
    test_questions: Optional[int] = None
    """Evaluate on the first N test questions (None: the whole test split)."""
    attempts: int = 4
    """Independent workflows per test question."""
    bootstrap_draws: int = 4000
    """Question-bootstrap draws of the report."""
    with_ablations: bool = False
    """Also train the outcome-reward Searcher and base-teacher ablations (read at their last step, as
    the paper's Table 3) and report search activity over training."""
    index_kind: str = "flat"
    """flat (MiniLM embeddings, FAISS) or bm25."""
    overrides: List[str] = field(default_factory=list)
    """Extra config overrides applied to every training stage (e.g. trainer.lr=5e-4)."""
    quick: bool = False
    """A smoke run of the pipeline (a smaller world, a few SFT and RL steps, short workflows): checks
    that every stage and artifact works, says nothing about the method."""
    world: List[str] = field(default_factory=list)
    """World settings as KEY=VALUE (any :class:`mopd.data.tinyworld.WorldSettings` field, e.g.
    test_per_dataset=100 bands=400): a larger test split narrows the intervals at little cost."""
    pi0: List[str] = field(default_factory=list)
    """Warm-start settings as KEY=VALUE (any :class:`mopd.data.warmstart.WarmStartSettings` field but
    seed, e.g. search_first=0.9 steps=600)."""
    stage2_questions_per_step: Optional[int] = None
    """Stage II questions per step (None: the tiny_mopd preset's)."""
    eval_split: str = "test"
    """The split the systems are evaluated on: test (the final numbers, looked at once) or dev
    (every tuning choice; reported under report_dev/, evaluations under eval_dev/)."""
    pi0_check_attempts: int = 4
    """Workflows per dev question when pi_0 is checked (format validity and EM, both workflows)."""
    weak_pi0_em: float = 0.15
    """pi_0 is flagged weak when its dev EM (mean of C-MAS and H-MAS) is below this
    (:class:`mopd.data.policy_check.WeakPi0`)."""
    weak_pi0_valid: float = 0.9
    """pi_0 is flagged weak when fewer of its Answerer outputs than this are valid."""
    eval_workers: int = 2
    """Processes for the final evaluations (every system, two at a time with 2, on a machine with
    at least 2 cores). Each evaluation is a function of its model, questions and seed, so the records
    are the same with 1 (tested); 2 halves the evaluation's wall time on a 2-core machine."""
    threads: int = 2
    """Intra-op threads of the stages that run alone (pi_0's SFT, Stage I); the Stage II arms and
    the evaluations run one thread each, side by side. A fixed number, not the machine's core count:
    results depend on it in the last bits (2 threads trained the tiny model 1.7x faster than 1 on
    the 2-core box, bench/RESULTS.md), so a run is reproducible on any machine."""
    arm_workers: int = 2
    """Stage II arms trained at once (processes, one thread each): MultiAgent-OPD and its
    no-Searcher-supervision control, and with ablations the outcome-reward Searcher and the base
    teacher. Each arm is a function of its config and seed, so its weights are the same with 1."""
    lockstep: bool = True
    """Roll out (training and evaluation) with the lock-step scheduler, whose engine batches are a
    function of the runs' states, instead of the asynchronous one, whose batches depend on timing:
    a call's sampling log-probs change in the last bits with what it is batched with (measured up to
    1e-6 on the HF engine), so only lock-step runs are bit-reproducible."""

    def __post_init__(self):
        from mopd.data.warmstart import parse_pi0_settings

        parse_pi0_settings(self.pi0)  # a bad KEY=VALUE fails here, before anything is built
        if self.eval_split not in ("test", "dev"):
            raise ValueError(f"eval_split={self.eval_split!r}: choose test or dev")
        if self.pi0_check_attempts < 0:
            raise ValueError("pi0_check_attempts must be >= 0 (0: no check)")
        if self.eval_workers < 1:
            raise ValueError("eval_workers must be >= 1")
        if self.arm_workers < 1:
            raise ValueError("arm_workers must be >= 1")
        if self.threads < 1:
            raise ValueError("threads must be >= 1")
        if self.stage2_questions_per_step is not None and self.stage2_questions_per_step < 1:
            raise ValueError("stage2_questions_per_step must be >= 1")
        world_settings(self)  # a bad KEY=VALUE fails here, before anything is built
        self.weak_pi0()       # and so does a threshold out of [0, 1]

    def weak_pi0(self):
        """The weak-pi_0 thresholds as one value (:class:`mopd.data.policy_check.WeakPi0`)."""
        from mopd.data.policy_check import WeakPi0

        return WeakPi0(em=self.weak_pi0_em, valid=self.weak_pi0_valid)


QUICK_WORKFLOW = {"max_output_tokens": 24, "max_steps": 3, "max_rounds": 1}
"""Workflow limits of a quick run (training and evaluation)."""
QUICK_OVERRIDES = ["trainer.questions_per_step=2", "rollout.group_size=2", "rollout.answer_candidates=2",
                   "trainer.val_every=1", "trainer.val_attempts=1", "data.dev_size=2"] + [f"rollout.{k}={v}" for k, v in QUICK_WORKFLOW.items()]


def world_settings(s: "DemoSettings"):
    """The :class:`mopd.data.tinyworld.WorldSettings` of a demo: the default (or quick) world with
    the demo's seed and index kind, then ``s.world``'s KEY=VALUE entries."""
    from mopd.data.tinyworld import parse_world_settings

    return parse_world_settings(s.world, seed=s.seed, index_kind=s.index_kind, quick=s.quick)


def _stage_config(preset: str, s: DemoSettings, world, model: str, out: Path, steps: int,
                  teacher: str = "", extra: Optional[List[str]] = None) -> Config:
    o = (QUICK_OVERRIDES if s.quick else []) + [f"model.path={model}", f"data.train={world.train}", f"data.dev={world.dev}",
         "retriever.kind=inprocess", f"retriever.index={world.index}", f"trainer.out_dir={out}",
         f"trainer.steps={steps}", f"trainer.seed={s.seed}", f"rollout.seed={s.seed}"]
    if teacher:
        o.append(f"teacher.path={teacher}")
        if s.stage2_questions_per_step is not None:
            o.append(f"trainer.questions_per_step={s.stage2_questions_per_step}")
    return resolve(preset, o + list(extra or []) + list(s.overrides))


def _stage_fingerprint(cfg: Config) -> str:
    """What a finished stage was trained with: its steps and the hash of its resolved config."""
    import hashlib

    from mopd.config import to_yaml

    return f"{cfg.trainer.steps} {hashlib.sha256(to_yaml(cfg).encode()).hexdigest()[:16]}"


def _rollout_fn(s: "DemoSettings"):
    """The scheduler the demo rolls out with (None: the trainer's and evaluator's default)."""
    if not s.lockstep:
        return None
    from mopd.rollout.scheduler import run_workflows

    return run_workflows


def _train_stage(name: str, cfg: Config, retriever, export_dir: Path, rollout_fn=None, which: str = "best",
                 progress: bool = True) -> Path:
    """Train (resuming a killed run) and export the ``which`` checkpoint (best dev or last); a
    finished stage exported by the same rule is reused."""
    from mopd.core.reproducible import deterministic_torch
    from mopd.train.trainer import PolicyTrainer

    done = export_dir / "config.json"
    marker = Path(cfg.trainer.out_dir) / "DONE"
    fingerprint = f"{_stage_fingerprint(cfg)} {which}"
    if done.is_file() and marker.is_file() and marker.read_text().strip() == fingerprint:
        _log(f"{name}: reusing {export_dir}")
        return export_dir
    _log(f"{name}: training {cfg.trainer.steps} steps ({cfg.method}) -> {cfg.trainer.out_dir}")
    t0 = time.perf_counter()
    deterministic_torch(max(1, cfg.trainer.cpu_threads))
    trainer = PolicyTrainer(cfg, retriever=retriever, resume=True, rollout_fn=rollout_fn, progress=progress)
    try:
        trainer.fit()
        if which == "best":
            _export_best(name, trainer, export_dir)
        else:
            _log(f"{name}: exporting the last step, {trainer.step}")
            trainer.export(export_dir, which="last")
    finally:
        trainer.close()
    marker.write_text(fingerprint)
    _log(f"{name}: done in {time.perf_counter() - t0:.0f}s; exported {export_dir}")
    return export_dir


def _export_best(name: str, trainer, export_dir: Path) -> Path:
    """Export the checkpoint with the best dev validation (the paper's model selection; step 0,
    the starting model, is not a candidate); the last weights when no validation ran."""
    from mopd.train import checkpoint as ckpt

    best = ckpt.read_best(trainer.run_dir)
    if best is None or best["step"] == trainer.step:
        _log(f"{name}: exporting the last step, {trainer.step}" + (", also the best on dev" if best else ""))
    else:
        _log(f"{name}: exporting step {best['step']}, the best dev {best['metric']} ({best['value']:.3f})")
    return trainer.export(export_dir, which="best")


@dataclass(frozen=True)
class Arm:
    """One Stage II run of the comparison: a system of the report, trained from pi_0."""

    name: str
    """The system's name in the report."""
    preset: str
    """Its tiny preset."""
    dir: str
    """Its run directory under the demo's."""
    label: str
    """Its validation curve's label."""


STAGE2_ARMS = [Arm("MultiAgent-OPD", "tiny_mopd", "stage2", "Stage II (MultiAgent-OPD)"),
               Arm("No Searcher supervision", "tiny_no_searcher_supervision", "stage2_no_searcher_supervision",
                   "Stage II, no Searcher supervision")]
"""The primary comparison: the same Stage II (pi_0, teacher, KL reference, seed, questions, steps,
checkpoint rule) with and without the Searcher's OPD loss."""
ABLATION_ARMS = [Arm("Outcome Searcher", "tiny_outcome_searcher", "ablation_outcome_searcher",
                     "Ablation (outcome Searcher)"),
                 Arm("Base teacher", "tiny_base_teacher", "ablation_base_teacher", "Ablation (base teacher)")]
"""``--with-ablations``: Table 3's other rows."""


def _arm_config(arm: Arm, s: DemoSettings, world, pi0: str, stage1: str, root: Path) -> Config:
    """The arm's config: Stage II from pi_0 with the Stage-I teacher; the base-teacher ablation
    distils from pi_0 and keeps the Stage-I model as the Leader's and Answerer's KL reference."""
    cfg = _stage_config(arm.preset, s, world, pi0, root / arm.dir, s.stage2_steps, teacher=stage1)
    if not cfg.reference.from_teacher:
        cfg.teacher.path, cfg.reference.path = pi0, stage1
    return cfg


def _train_arms(arms: List[Arm], cfgs: List[Config], s: DemoSettings, world, retriever, root: Path) -> List[Path]:
    """Train the Stage II arms, ``s.arm_workers`` at a time (spawned processes, one thread each,
    each with its own retriever over the world's index), exporting every arm's last step (the
    paper's Table 3 reads its rows at the last step, where a collapse shows). One progress line
    per minute while they run."""
    import multiprocessing
    import os
    from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait

    exports = [root / a.dir / "export" for a in arms]
    workers = min(s.arm_workers, len(arms), os.cpu_count() or 1)
    if workers <= 1:
        return [_train_stage(a.name, c, retriever, e, _rollout_fn(s), which="last")
                for a, c, e in zip(arms, cfgs, exports)]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_train_arm_in_worker, a.name, c, str(e), str(world.index), s)
                   for a, c, e in zip(arms, cfgs, exports)]
        while True:
            done, pending = wait(futures, timeout=60, return_when=FIRST_EXCEPTION)
            for f in done:
                f.result()   # re-raises a worker's error here
            if not pending:
                break
            _log("Stage II arms: " + ", ".join(f"{a.name} step {_last_step(root / a.dir)}/{c.trainer.steps}"
                                               for a, c in zip(arms, cfgs)))
    return exports


def _last_step(run_dir: Path) -> int:
    """The last step a run's metrics.jsonl logged (0 before the first)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    lines = path.read_text(encoding="utf-8").splitlines()
    try:
        return int(json.loads(lines[-1]).get("step", 0)) if lines else 0
    except ValueError:   # a line being written
        return int(json.loads(lines[-2]).get("step", 0)) if len(lines) > 1 else 0


def _train_arm_in_worker(name: str, cfg: Config, export_dir: str, index: str, s: DemoSettings) -> Path:
    from mopd.config import RetrieverConfig
    from mopd.retriever import load_retriever
    from mopd.retriever.memo import QueryMemo

    retriever = QueryMemo(load_retriever(RetrieverConfig(kind="inprocess", index=index)))
    return _train_stage(name, cfg, retriever, Path(export_dir), _rollout_fn(s), which="last", progress=False)


def _evaluate(name: str, model_dir: str, workflow: str, questions, retriever, s: DemoSettings, out: Path) -> Path:
    """The paper's protocol (1 candidate, T 0.6, top-p 0.95) with the tiny presets' workflow limits and
    Searcher template, as the training stages' overrides set them (``mopd demo
    rollout.searcher_sees_question=true`` evaluates every H-MAS system with the opt-in template)."""
    from mopd.core.fingerprint import model_fingerprint
    from mopd.eval.runner import EvalPlan, evaluate
    from mopd.rollout.run_state import WorkflowSettings

    tiny = resolve("tiny_cmas_rl" if workflow == "cmas" else "tiny_mopd", list(s.overrides))
    cfg = resolve("cmas_base" if workflow == "cmas" else "hmas_base",
                  [f"model.path={model_dir}", f"eval.attempts={s.attempts}", f"rollout.seed={s.seed}"])
    for key in ("max_input_tokens", "max_output_tokens", "max_steps", "max_rounds", "max_searchers_per_wave",
                "searcher_sees_question"):
        setattr(cfg.rollout, key, getattr(tiny.rollout, key))
    if s.quick:
        for key, value in QUICK_WORKFLOW.items():
            setattr(cfg.rollout, key, value)
    from mopd.core.reproducible import deterministic_torch

    _log(f"eval {name}: {len(questions)} questions x {s.attempts} attempts ({workflow})")
    t0 = time.perf_counter()
    deterministic_torch(1)
    plan = EvalPlan(out, WorkflowSettings.for_evaluation(cfg, workflow), attempts=s.attempts, method=name,
                    model=model_fingerprint(model_dir))
    _set_aside_if_stale(out, plan.fixed_settings())
    path = evaluate(model_dir, None, retriever, questions, plan, cfg, run_fn=_rollout_fn(s))
    _log(f"eval {name}: {time.perf_counter() - t0:.0f}s")
    return path


def _set_aside_if_stale(out: Path, settings: dict) -> None:
    """An evaluation this demo wrote earlier for another model or other settings (a stage
    retrained with other steps, say) is moved to ``out.replaced-N``, never resumed or deleted: its
    records would otherwise be refused by the evaluator, or, before evaluations were keyed on
    the model's weights, silently reused."""
    from mopd.eval.runner import settings_changes

    if not settings_changes(out, settings):
        return
    n = 1
    while out.with_name(f"{out.name}.replaced-{n}").exists():
        n += 1
    aside = out.with_name(f"{out.name}.replaced-{n}")
    out.rename(aside)
    _log(f"{out} was evaluated with another model or settings: moved to {aside}")


def _evaluate_systems(systems, questions, world, retriever, s: DemoSettings, out_root: Path) -> List[Path]:
    """Evaluate ``systems`` [(name, model directory, workflow)] into ``out_root/<slug>``, in
    ``s.eval_workers`` processes (spawned; each loads its own retriever over the world's index and
    searches every query alone, as this process does)."""
    import os

    outs = [out_root / name.lower().replace(" ", "_").replace("+", "plus").replace("-", "_")
            for name, _, _ in systems]
    jobs = [(name, model_dir, workflow, out) for (name, model_dir, workflow), out in zip(systems, outs)]
    workers = min(s.eval_workers, len(jobs), os.cpu_count() or 1)
    if workers <= 1:
        for name, model_dir, workflow, out in jobs:
            _evaluate(name, model_dir, workflow, questions, retriever, s, out)
        return outs
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # H-MAS evaluations take about twice as long as C-MAS ones: submitted first, the two workers
    # finish together (longest job first)
    jobs = sorted(jobs, key=lambda j: j[2] != "hmas")
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_evaluate_in_worker, job, questions, str(world.index), s) for job in jobs]
        for f in futures:
            f.result()   # re-raises a worker's error here
    return outs


def _evaluate_in_worker(job, questions, index: str, s: DemoSettings) -> Path:
    from mopd.config import RetrieverConfig
    from mopd.retriever import load_retriever
    from mopd.retriever.memo import QueryMemo

    name, model_dir, workflow, out = job
    retriever = QueryMemo(load_retriever(RetrieverConfig(kind="inprocess", index=index)))
    return _evaluate(name, model_dir, workflow, questions, retriever, s, out)


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


def _eval_questions(world, s: DemoSettings):
    """The questions of the final evaluation: the only place the demo reads ``s.eval_split``."""
    from mopd.data.tinyworld import load_split

    questions = load_split(world, s.eval_split)
    if s.test_questions is not None:
        questions = spread_over_datasets(questions, s.test_questions)
    return questions


def run_demo(s: DemoSettings) -> Path:
    """Run every stage (reusing finished ones); returns the report's path.

    Nothing before the final evaluation reads the evaluation split: pi_0 trains on the training
    split, its check and both stages' validation curves use the dev split."""
    from mopd.config import RetrieverConfig
    from mopd.core.reproducible import deterministic_torch, environment_record
    from mopd.data.tinyworld import build_world
    from mopd.data.warmstart import build_pi0, parse_pi0_settings
    from mopd.retriever import load_retriever
    from mopd.retriever.memo import QueryMemo

    root = Path(s.out)
    root.mkdir(parents=True, exist_ok=True)
    (root / "demo_settings.json").write_text(json.dumps(asdict(s), indent=2))
    deterministic_torch(1)
    (root / "environment.json").write_text(json.dumps(environment_record(), indent=2))
    t_start = time.perf_counter()
    run_started = time.time()
    times: Dict[str, float] = {}

    t = time.perf_counter()
    _log(f"world + {s.index_kind} index -> {root / 'world'}")
    world = build_world(root / "world", settings=world_settings(s))
    # every query searched alone (and remembered): its passages never depend on its batch
    retriever = QueryMemo(load_retriever(RetrieverConfig(kind="inprocess", index=str(world.index))))
    times["world"] = time.perf_counter() - t

    t = time.perf_counter()
    _log(f"pi_0 warm start (SFT on scripted demonstrations) -> {root / 'pi0'}")
    kw = parse_pi0_settings(s.pi0)
    if s.pi0_steps is not None:
        kw["steps"] = s.pi0_steps
    kw["threads"] = s.threads
    if s.quick:
        kw.update(steps=s.pi0_steps or 3, max_questions=8, attempts=1, episodes_per_step=4)
    deterministic_torch(1)
    pi0 = str(build_pi0(world.root, root / "pi0", seed=s.seed, **kw))
    times["pi0"] = time.perf_counter() - t

    check = None
    if s.pi0_check_attempts:
        t = time.perf_counter()
        check = check_pi0(pi0, world, s, root / "pi0_check.json")
        times["pi0_check"] = time.perf_counter() - t

    t = time.perf_counter()
    cfg1 = _stage_config("tiny_cmas_rl", s, world, pi0, root / "stage1", s.stage1_steps,
                         extra=[f"trainer.cpu_threads={s.threads}"])
    stage1 = str(_train_stage("Stage I", cfg1, retriever, root / "stage1" / "export", _rollout_fn(s)))
    times["stage1"] = time.perf_counter() - t

    t = time.perf_counter()
    arms = STAGE2_ARMS + (ABLATION_ARMS if s.with_ablations else [])
    cfgs = [_arm_config(a, s, world, pi0, stage1, root) for a in arms]
    exports = _train_arms(arms, cfgs, s, world, retriever, root)
    times["stage2"] = time.perf_counter() - t

    systems = [("C-MAS base", pi0, "cmas"), ("C-MAS + RL", stage1, "cmas"), ("H-MAS base", pi0, "hmas")]
    systems += [(a.name, str(e), "hmas") for a, e in zip(arms, exports)]
    logs = [root / "stage1" / "metrics.jsonl"] + [root / a.dir / "metrics.jsonl" for a in arms]
    labels = ["Stage I (C-MAS + RL)"] + [a.label for a in arms]

    # The evaluation split is read here, after every model is final.
    t = time.perf_counter()
    dev = s.eval_split == "dev"
    questions = _eval_questions(world, s)
    runs = _evaluate_systems(systems, questions, world, retriever, s, root / ("eval_dev" if dev else "eval"))
    times["eval"] = time.perf_counter() - t

    report = write_report(runs, [n for n, _, _ in systems], root / ("report_dev" if dev else "report"),
                          ReportInputs(logs=logs, labels=labels, draws=s.bootstrap_draws, dev=dev, pi0_check=check))
    times["total"] = time.perf_counter() - t_start
    from mopd.data.warmstart import read_pi0

    rebuilt = {"stage1": _written_since(root / "stage1" / "DONE", run_started),
               "stage2": any(_written_since(root / a.dir / "DONE", run_started) for a in arms)}
    _write_timings(root / "timings.json", times, built={"pi0": (read_pi0(pi0) or {}).get("seconds", {}).get("total", 0.0)},
                   rebuilt=rebuilt)
    _log(f"finished in {times['total'] / 60:.1f} min; report: {report}")
    return report


def check_pi0(pi0: str, world, s: DemoSettings, path: Path) -> dict:
    """pi_0's format validity and strict EM on the dev split, both workflows, ``s.pi0_check_attempts``
    workflows per question at the evaluation temperature; flagged weak below the thresholds."""
    from mopd.data.policy_check import check_pi0_cached

    attempts = min(s.pi0_check_attempts, 1) if s.quick else s.pi0_check_attempts
    return check_pi0_cached(pi0, world.root, path, attempts=attempts, seed=s.seed, weak=s.weak_pi0(), log=_log)


def run_seeds(s: DemoSettings, seeds: List[int]) -> Path:
    """The demo on each of ``seeds`` (``s.out``/seed{N}, finished stages reused), then the
    multi-seed summary (``s.out``/summary.json and summary.md); returns the summary's path."""
    import dataclasses

    root = Path(s.out)
    for n in seeds:
        _log(f"seed {n}: {root / f'seed{n}'}")
        run_demo(dataclasses.replace(s, seed=n, out=str(root / f"seed{n}")))
    return write_seed_summary(root, seeds, draws=s.bootstrap_draws, split=s.eval_split)


def _written_since(path: Path, t: float) -> bool:
    """Whether ``path`` exists and was written at or after wall time ``t`` (a stage built by this run)."""
    return path.is_file() and path.stat().st_mtime >= t - 1.0


def _write_timings(path: Path, times: Dict[str, float], built: Optional[Dict[str, float]] = None,
                   rebuilt: Optional[Dict[str, bool]] = None) -> None:
    """Stage seconds of the run that built each stage, and under ``last_run`` this run's own: a
    re-run reuses finished stages in a moment, so where an earlier run of this directory took
    longer for a stage, its time is kept at the top level (what the README's tables report),
    unless ``rebuilt`` says this run built that stage again (other steps, say): then this run's
    time replaces the old one. ``built``: stage seconds recorded where a stage was built outside a
    demo run (pi_0 by `mopd world pi0-check`: its pi0.json). The top-level total is at least the
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
