"""The teacher checked before it teaches: before the Stage II arms start, the Stage-I export (their
teacher) and the base model are evaluated on the dev split in C-MAS (Stage I's workflow and limits)
and compared per dataset, the question type of a QA record (``nq``, ``hotpotqa``, one-hop and
two-hop chains, ...).

A teacher can gain on one type while losing on another (a demo seed's Stage-I model lost one-hop
accuracy, 67.92 against the base's 71.67 on test, while gaining 36 points on two-hop), and OPD
then distils that loss into the Searcher. The check writes ROOT/teacher_check/
(``teacher_check.json`` and the report's section ``teacher_check.md``) and says in one line, in
the log and the report, where the teacher is worse than the base on a type that an arm distilling
its Searcher from the teacher trains on. It warns; it never stops the pipeline (dev is small: the
table carries the paired question-bootstrap interval of each difference).

With ``eval.split: dev`` the check's two evaluations are the pipeline's own evaluations of the
C-MAS base and Stage-I systems, run before the arms instead of after them (and then reused);
otherwise it evaluates both on dev under ROOT/teacher_check/{base,teacher}
(``teacher_check.attempts`` and ``.questions``). :func:`plan_with_check` puts the check into
:func:`mopd.pipeline.stages.plan`'s stages; nothing here loads a model.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence

from mopd.core.qa import load_questions
from mopd.eval.alignment import align_runs
from mopd.eval.bootstrap import paired_intervals
from mopd.eval.loading import read_eval_records, records_file
from mopd.eval.metrics import dataset_means, outcomes, question_metrics
from mopd.eval.tables import markdown_table, pct, signed_pct
from mopd.pipeline.config import EvalSettings, PipelineConfig, SystemConfig
from mopd.pipeline.owner import check_live_owner
from mopd.pipeline.stages import (DONE, EvalStage, ReportStage, Stage, TrainStage, _eval_stage, _hash, plan,
                                  read_marker)

CHECK_JSON = "teacher_check.json"
CHECK_MD = "teacher_check.md"
DRAWS = 2000
"""Bootstrap draws of each difference's interval."""


def distills_searcher(run_cfg) -> bool:
    """Whether a Stage II config distils its Searcher from its teacher (OPD advantage on the
    Searcher's tokens with a non-zero policy term)."""
    spec = run_cfg.algo.role("searcher")
    return spec.advantage == "opd" and spec.pg_coef != 0 and spec.opd_coef != 0


def compare(base: Sequence, teacher: Sequence, trained_types: Sequence[str], distilled_by: Sequence[str],
            draws: int = DRAWS) -> dict:
    """The per-type table of ``teacher``'s and ``base``'s records (the same dev questions and
    attempts): avg@K strict EM of each, the difference teacher minus base with its paired
    question-bootstrap interval, whether the type is trained on, and the warning line (None when
    the teacher is nowhere worse on a type that ``distilled_by``'s arms train their Searcher on)."""
    runs = align_runs({"base": list(base), "teacher": list(teacher)})
    d = len(runs.datasets)
    avg = question_metrics(outcomes(runs).strict)["avg"]    # [2, Q]
    means = dataset_means(avg, runs.dataset_index, d)      # [2, D]
    iv = paired_intervals(avg[:, None, :], runs.dataset_index, d, reference=1, draws=draws)
    counts = runs.questions_per_dataset()
    trained = set(trained_types)
    rows = []
    for j, name in enumerate(runs.datasets):
        b, t = float(means[0, j]), float(means[1, j])
        rows.append({"type": name, "questions": int(counts[j]), "base": b, "teacher": t, "difference": t - b,
                     "ci": [float(iv.diff_dataset_lo[0, 0, j]), float(iv.diff_dataset_hi[0, 0, j])],
                     "trained": name in trained, "lost": t < b})
    check = {"attempts": runs.k, "types": rows, "distilled_by": list(distilled_by),
             "trained_types": sorted(trained)}
    check["warning"] = warning_line(check)
    return check


def warning_line(check: dict) -> Optional[str]:
    """One line naming every type the teacher is worse on than the base and a distilled Searcher
    trains on (None: none, or no arm distils its Searcher from the teacher)."""
    lost = [r for r in check["types"] if r["lost"] and r["trained"]]
    if not lost or not check["distilled_by"]:
        return None
    k = check["attempts"]
    what = "; ".join(f"{r['type']} {100 * r['teacher']:.2f} vs {100 * r['base']:.2f} "
                     f"({100 * r['difference']:+.2f} [{100 * r['ci'][0]:+.2f}, {100 * r['ci'][1]:+.2f}], "
                     f"{r['questions']} questions)" for r in lost)
    return (f"teacher check: the Stage-I teacher is worse than the base on dev (avg@{k} EM, teacher vs base) "
            f"on {what}, and {', '.join(check['distilled_by'])} distil{'s' if len(check['distilled_by']) == 1 else ''} "
            "its Searcher from it on that type")


def markdown(check: dict) -> str:
    """The report's section: the table, and the warning (or that there is none)."""
    k = check["attempts"]
    rows = [[r["type"], str(r["questions"]), pct(r["base"]), pct(r["teacher"]),
             f"{signed_pct(r['difference'])} [{signed_pct(r['ci'][0])}, {signed_pct(r['ci'][1])}]",
             "yes" if r["trained"] else "no", "**worse**" if r["lost"] else ""] for r in check["types"]]
    table = markdown_table(["type (dataset)", "dev questions", f"base avg@{k}", f"teacher avg@{k}",
                            "teacher - base [95% CI]", "trained on", ""], rows)
    arms = ", ".join(check["distilled_by"]) or "no arm"
    lines = ["## The teacher before it teaches", "",
             f"Stage I's export, the teacher of the Stage II arms, against the base model on the dev split in "
             f"C-MAS, per question type, strict EM over {k} attempts per question (paired question-bootstrap "
             f"intervals), checked before the arms trained. Searcher distilled from it: {arms}.", "", table, ""]
    if check["warning"]:
        lines += [f"**Warning:** {check['warning']}.", ""]
    else:
        lines += ["No warning: the teacher is nowhere worse than the base on a type a distilled Searcher trains on.",
                  ""]
    return "\n".join(lines)


def trained_types(path: str) -> List[str]:
    """The datasets (question types) of a training file."""
    questions, _ = load_questions(path)
    return sorted({q.dataset for q in questions})


def _stat(path: str) -> list:
    p = Path(path)
    return [str(p), p.stat().st_size, p.stat().st_mtime_ns] if p.is_file() else [str(p), None]


@dataclass
class TeacherCheckStage(Stage):
    """The comparison of the teacher check, in this process (it reads two evaluations' records)."""

    base: Optional[EvalStage] = None
    teacher: Optional[EvalStage] = None
    train_data: str = ""
    """The training questions (their datasets are the types the arms train on)."""
    distilled: List[str] = field(default_factory=list)
    """The arms that distil their Searcher from the Stage-I teacher."""

    @property
    def out(self) -> Path:
        return Path(self.outputs[0])

    @property
    def markdown_path(self) -> Path:
        return self.out / CHECK_MD

    def fingerprint(self) -> str:
        return _hash({"base": read_marker(self.base.out / DONE), "teacher": read_marker(self.teacher.out / DONE),
                      "distilled": self.distilled, "train": _stat(self.train_data)})

    def done(self) -> bool:
        return (self.out / CHECK_JSON).is_file() and read_marker(self.out / DONE) == self.fingerprint()

    def mark_done(self) -> None:
        check_live_owner(self.key)
        (self.out / DONE).write_text(self.fingerprint())

    def command(self, cfg) -> List[str]:
        return ["(in-process)", f"{__name__}.run_check", str(self.base.out), str(self.teacher.out),
                "--out", str(self.out)]

    def disk(self) -> str:
        return "the check's table"

    def report_inputs(self) -> List[str]:
        return [str(self.markdown_path)]

    def run(self, log) -> dict:
        """Compare the two evaluations (reused when they, the training data and the arms are
        unchanged) and say the warning, if any, in the log."""
        if self.done():
            check = json.loads((self.out / CHECK_JSON).read_text())
            log(f"teacher check: reusing {self.out / CHECK_JSON}")
        else:
            check = run_check(self.base.out, self.teacher.out, self.out, trained_types(self.train_data),
                              self.distilled)
            self.mark_done()
        log(check["warning"] or "teacher check: the teacher is nowhere worse than the base on a distilled type "
            "(dev, C-MAS; teacher - base): " + ", ".join(f"{r['type']} {100 * r['difference']:+.2f}"
                                                          for r in check["types"]))
        return check


def teacher_check_stages(cfg: PipelineConfig, stage1: TrainStage, arms: Sequence[TrainStage],
                         evals: Sequence[EvalStage]) -> List[Stage]:
    """The check's stages, to run between Stage I's exports and the arms: its two evaluations
    (``evals``' own C-MAS base and Stage-I stages when the pipeline evaluates on dev, else two of
    its own on dev under ``teacher_check.dir``) and the comparison. Empty when
    ``teacher_check.enabled`` is off, or there is no dev split or no arm."""
    s = cfg.teacher_check
    if not s.enabled or not cfg.data.dev or not arms:
        return []
    if cfg.eval.split == "dev":
        own = {e.system.model: e for e in evals if e.system.workflow == "cmas" and e.system.model in ("base", "stage1")}
        if len(own) == 2:
            return [own["base"], own["stage1"], _check_stage(cfg, own["base"], own["stage1"], stage1, arms)]
    c = copy.copy(cfg)
    c.eval = EvalSettings(split="dev", attempts=s.attempts or cfg.eval.attempts, questions=s.questions,
                          overrides=list(cfg.eval.overrides), dir=s.dir)
    pair = []
    for name, model, what in (("base", "base", "the base model"), ("teacher", "stage1", "the Stage-I teacher")):
        e = _eval_stage(c, SystemConfig(name, model, "cmas"), stage1.config)
        e.key, e.group = f"teacher_check.{name}", "teacher_check"
        e.title = f"teacher check: {what} on dev, " + e.title.split(": evaluate ", 1)[1]
        pair.append(e)
    return pair + [_check_stage(cfg, pair[0], pair[1], stage1, arms)]


def plan_with_check(cfg: PipelineConfig) -> List[Stage]:
    """:func:`mopd.pipeline.stages.plan`'s stages with the teacher check between Stage I's exports
    and the first arm (with ``eval.split: dev``, the C-MAS base's and Stage I's own evaluations
    moved there), and its table among the report's sections."""
    stages = plan(cfg)
    trains = [s for s in stages if isinstance(s, TrainStage)]
    arms = [s for s in trains if s.group == "stage2"]
    check = teacher_check_stages(cfg, trains[0], arms, [s for s in stages if isinstance(s, EvalStage)])
    if not check:
        return stages
    rest = [s for s in stages if not any(s is c for c in check)]
    first_arm = rest.index(arms[0])
    sections = [f for s in check for f in s.report_inputs()]
    for report in (s for s in rest if isinstance(s, ReportStage)):
        report.sections = report.sections + sections
        report.setup_files = report.setup_files + sections
    return rest[:first_arm] + check + rest[first_arm:]


def _check_stage(cfg: PipelineConfig, base: EvalStage, teacher: EvalStage, stage1: TrainStage,
                 arms: Sequence[TrainStage]) -> TeacherCheckStage:
    """The comparison; the arms distilling from Stage I are those whose Searcher is on OPD with a
    teacher under Stage I's run directory (its export, or a LoRA Stage I's adapter export)."""
    distilled = [a.spec.name for a in arms
                 if distills_searcher(a.config) and Path(a.config.teacher.path).parent == stage1.run_dir]
    return TeacherCheckStage(key="teacher_check", group="teacher_check",
                             title="teacher check: the Stage-I teacher against the base on dev, per question type",
                             inputs=[str(base.out), str(teacher.out)],
                             outputs=[str(Path(cfg.root) / cfg.teacher_check.dir)], base=base, teacher=teacher,
                             train_data=cfg.data.train, distilled=distilled)


def run_check(base_dir, teacher_dir, out, types: Sequence[str], distilled_by: Sequence[str]) -> dict:
    """Compare the records in ``base_dir`` and ``teacher_dir``; write ``out``/teacher_check.json and
    its report section ``out``/teacher_check.md; return the check."""
    check = compare(read_eval_records(records_file(base_dir)), read_eval_records(records_file(teacher_dir)),
                    types, distilled_by)
    check.update({"base": str(base_dir), "teacher": str(teacher_dir)})
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / CHECK_JSON).write_text(json.dumps(check, indent=1) + "\n")
    (out / CHECK_MD).write_text(markdown(check))
    return check


def report_sections(paths: Sequence[str]) -> str:
    """The markdown of the report sections in ``paths`` that exist, joined."""
    return "\n".join(Path(p).read_text() for p in paths if Path(p).is_file())
