"""The demo's report: the claims it checks (paired bootstrap differences), the pi_0 check's table,
and the multi-seed summary with its tables (rendered into docs/demo.md by ``mopd demo-docs``).

The pipeline that produces what these read is :mod:`mopd.recipes.tiny_world.demo`.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from mopd.eval.bootstrap import DEFAULT_SEED
from mopd.eval.alignment import align_runs
from mopd.eval.metrics import outcomes, question_metrics
from mopd.eval.report import ReportOptions, report_runs
from mopd.eval.report import load_runs
from mopd.eval.seeds import interval_verdict
from mopd.eval.summary import summarize
from mopd.recipes.tiny_world.seed_summary import summarize_seeds


def log(msg: str) -> None:
    """One timestamped line of the demo's progress on stderr (the pipeline's and the report's)."""
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class ReportInputs:
    """What the report shows besides the evaluations."""

    logs: List[Path]
    """Training stages' metrics.jsonl, for the validation curves."""
    labels: List[str]
    """A label per log."""
    draws: int
    """Question-bootstrap draws."""
    dev: bool = False
    """The systems were evaluated on the dev split (the tuning path)."""
    pi0_check: Optional[dict] = None
    """pi_0's dev check (:func:`mopd.recipes.tiny_world.policy_check.check_pi0_cached`), appended when given."""
    training: str = ""
    """How the stages trained, above the claims (:func:`training_note`: LoRA runs only)."""
    teacher_check: str = ""
    """The teacher check's section (markdown: :mod:`mopd.pipeline.teacher_check`), below the claims."""


def write_report(runs: List[Path], names: List[str], report_dir: Path, inputs: ReportInputs) -> Path:
    """report.md with its plots and metrics (``mopd eval report``'s) and the claims at its top,
    claims.json, and the pi_0 check; returns the report's path."""

    claims = check_claims(dict(zip(names, runs)), draws=inputs.draws)
    title = ("MultiAgent-OPD on the built-in tiny world" + (", LoRA" if inputs.training else "")
             + (" (dev split: for tuning)" if inputs.dev else ""))
    report = report_runs(runs, report_dir, ReportOptions(
        names=names, reference="MultiAgent-OPD", draws=inputs.draws, seed=DEFAULT_SEED,
        validation_logs=inputs.logs, validation_labels=inputs.labels, title=title,
        top_sections=inputs.training + claims_markdown(claims) + inputs.teacher_check, linked=CLAIMS[0].base))
    (report_dir / "claims.json").write_text(json.dumps(claims, indent=2))
    for c in claims:
        log(f"claim {c['kind']} ({c['label']}): {claim_name(c)}, {c['metric']} {claim_interval(c)} -> "
            f"{VERDICT_TEXT[c['verdict']]}" + (" (holds)" if c["holds"] else " (does NOT hold)"))
    check = inputs.pi0_check
    if check is not None:
        (report_dir / "pi0_check.json").write_text(json.dumps(check, indent=2))
        with report.open("a", encoding="utf-8") as f:
            f.write("\n" + pi0_check_markdown(check))
        if check["weak"]:
            log("WARNING: " + check["verdict"])
    return report


def training_note(run_dirs: List[Path], labels: List[str]) -> str:
    """The report's Training section when a stage trained LoRA adapters: each training run (its
    config.yaml) with its rank, alpha, target modules and lr, or "all weights". Empty when every
    run trained all weights, so a full fine-tuning demo's report is unchanged."""
    import yaml

    rows, lora_seen = [], False
    for run, label in zip(run_dirs, labels):
        try:
            cfg = yaml.safe_load((Path(run) / "config.yaml").read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError):
            rows.append(f"- {label}: its config.yaml cannot be read")
            continue
        lora, lr = (cfg.get("model") or {}).get("lora") or {}, (cfg.get("trainer") or {}).get("lr")
        if lora.get("rank"):
            lora_seen = True
            rows.append(f"- {label}: LoRA adapters of rank {lora['rank']}, alpha {lora.get('alpha'):g}, on "
                        f"{', '.join(lora.get('target_modules') or [])}, over pi_0's frozen weights; lr {lr:g}")
        else:
            rows.append(f"- {label}: all weights; lr {lr:g}")
    if not lora_seen:
        return ""
    return "\n".join(["## Training", "", *rows, "",
                      "A LoRA Stage II's teacher is Stage I's adapter over the same base (a view of the student's "
                      "own base); every trained system is evaluated as its adapter merged into pi_0 (a plain model).",
                      ""]) + "\n"


@dataclass(frozen=True)
class Claim:
    """One difference the demo checks: ``trained`` minus ``base``, strict macro avg@K."""

    kind: str
    """primary (what the method adds), headline (the paper's main comparison), check (training
    works: a trained system against its own start), ablation (the method against a variant)."""
    label: str
    """What the difference measures, in words."""
    trained: str
    """The system whose score comes first (the method, or the trained system)."""
    base: str
    """The system subtracted."""


CLAIMS = [
    Claim("primary", "OPD's own contribution (Table 3's control: Stage II with the Searcher's loss at 0)",
          "MultiAgent-OPD", "No Searcher supervision"),
    Claim("headline", "the paper's headline comparison", "MultiAgent-OPD", "C-MAS + RL"),
    Claim("check", "Stage I training works", "C-MAS + RL", "C-MAS base"),
    Claim("check", "Stage II training works", "MultiAgent-OPD", "H-MAS base"),
    Claim("ablation", "against the outcome-reward Searcher (read at its last step)", "MultiAgent-OPD",
          "Outcome Searcher"),
    Claim("ablation", "against OPD from the base model pi_0 (read at its last step)", "MultiAgent-OPD",
          "Base teacher"),
]
"""The claims, in the order the report, claims.json and docs/demo.md list them; a claim whose two
systems are not both among the evaluated runs is left out."""

VERDICT_TEXT = {"above": "above 0", "below": "below 0", "indistinguishable": "not distinguishable from 0"}
"""How the report says where a difference's 95% interval lies."""


def verdict(ci) -> str:
    """above / below when the whole 95% interval ``ci`` is on one side of 0, else indistinguishable."""

    return interval_verdict(*ci)


def claim_name(c: dict) -> str:
    return f"{c['trained']} minus {c['base']}"


def with_claim_fields(c: dict) -> dict:
    """A claims.json record with kind, label and verdict: a record written before they existed
    (trained, base, diff, ci, holds only) gets those of the claim with its two systems, or kind
    "claim" and its systems as label when no claim has them."""
    out = dict(c)
    known = next((k for k in CLAIMS if (k.trained, k.base) == (c["trained"], c["base"])), None)
    out.setdefault("kind", known.kind if known else "claim")
    out.setdefault("label", known.label if known else claim_name(c))
    out.setdefault("verdict", verdict(c["ci"]))
    return out


def check_claims(runs: Dict[str, Path], draws: int, seed: int = DEFAULT_SEED) -> List[dict]:
    """Paired question-bootstrap difference of strict macro avg@K for each claim of ``CLAIMS``
    whose systems are both in ``runs``, in that order: trained minus base, its 95% interval and
    verdict; a claim holds when the whole interval is above 0."""

    out = []
    for claim in CLAIMS:
        trained, base = claim.trained, claim.base
        if trained not in runs or base not in runs:
            continue
        pair = load_runs([runs[base], runs[trained]], [base, trained])
        summary = summarize(pair, reference=trained, draws=draws, seed=seed)
        k = summary["metric_names"]["avg"]
        row = summary["accuracy"]["strict"][base]["macro"][k]
        ci = list(row["diff_ci"])
        out.append({"kind": claim.kind, "label": claim.label, "trained": trained, "base": base, "metric": k,
                    "diff": row["diff_vs_reference"], "ci": ci, "holds": bool(ci[0] > 0), "verdict": verdict(ci),
                    "questions": claim_questions(pair)})
    return out


def claim_interval(c: dict) -> str:
    """A claim's difference and interval in signed percentage points: ``+4.20 [+1.00, +7.30]``."""
    return f"{points(c['diff'])} [{points(c['ci'][0])}, {points(c['ci'][1])}]"


def claims_table(claims: List[dict]) -> str:
    """The claims in order: kind, what is compared, the difference with its interval, the verdict
    (records of older runs get their kind and label by :func:`with_claim_fields`)."""
    rows = ["| # | kind | claim | difference [95% interval] | verdict |", "|---|---|---|---|---|"]
    for i, c in enumerate(with_claim_fields(c) for c in claims):
        rows.append(f"| {i + 1} | {c['kind']} | {claim_name(c)}: {c['label']} | **{claim_interval(c)}** | "
                    f"{VERDICT_TEXT[c['verdict']]}" + (" (holds)" if c["holds"] else "") + " |")
    return "\n".join(rows)


def claims_markdown(claims: List[dict]) -> str:
    """The report's Claims section."""
    metric = claims[0]["metric"] if claims else "avg@K"
    return "\n".join([
        "## Claims", "",
        (f"Strict macro {metric}, trained (first) minus base system, in points; 95% interval of the paired "
         "question bootstrap. A claim holds when its whole interval is above 0; every claim is listed "
         "whatever its sign."), "",
        claims_table(claims) if claims else "No claim's two systems were both evaluated."]) + "\n"


def claim_questions(pair) -> List[dict]:
    """Per question (dataset, id): strict avg@K of the base (first) and the trained (second) system,
    so a multi-seed summary can bootstrap seeds and questions from the committed claims alone."""

    runs = align_runs(pair)
    avg = question_metrics(outcomes(runs).strict)["avg"]  # [2, Q]
    return [{"dataset": d, "id": q, "base": float(avg[0, i]), "trained": float(avg[1, i])}
            for i, (d, q) in enumerate(runs.questions)]


def pi0_check_markdown(check: dict) -> str:
    rows = ["## Warm start (pi_0) on the dev split", "",
            f"{check['attempts']} workflows per dev question, T=0.6. {check['verdict']}", "",
            "| workflow | strict EM | Answerer outputs valid | invalid calls | searches |",
            "| :--- | ---: | ---: | ---: | ---: |"]
    for wf, r in check["workflows"].items():
        rows.append(f"| {wf} | {r['em']:.3f} | {r['answer_valid']:.3f} | {r['invalid_calls']:.3f} | "
                    f"{r['searches']:.2f} |")
    return "\n".join(rows) + "\n"


DECOMPOSITION_DATASET = "tiny_pair_towns"   # mopd.recipes.tiny_world.world_text.PAIR_TOWNS (no import: data sits below)
"""The question type on which the seed summary shows how often the Leader splits a question."""


def decomposition(metrics: dict, dataset: str = DECOMPOSITION_DATASET) -> Optional[dict]:
    """From a report's metrics.json: on ``dataset``, the fraction of workflows whose Leader delegated
    two or more subtasks (in all, and in one output) for MultiAgent-OPD and H-MAS base; None when
    the report has no role activity or no such dataset (an older or partial run)."""
    act = metrics.get("activity", {})
    out = {"dataset": dataset}
    for system in ("MultiAgent-OPD", "H-MAS base"):
        row = act.get(system, {}).get("per_dataset", {}).get(dataset)
        if row is not None and row.get("multi_subtask") is not None:
            out[system] = {k: row[k] for k in ("multi_subtask", "multi_subtask_one_wave")}
    return out if "MultiAgent-OPD" in out else None


def write_seed_summary(root, seeds: List[int], draws: int = 4000, split: str = "test") -> Path:
    """summary.json and summary.md of finished seed runs under ``root``: per claim (in ``CLAIMS``'s
    order; claims.json of older runs, without kind and label, get them from their systems), on how
    many seeds it holds and the pooled effect with a bootstrap over seeds and questions; per seed,
    how often the trained Leader splits a ``DECOMPOSITION_DATASET`` question."""

    root = Path(root)
    report = "report_dev" if split == "dev" else "report"
    per_seed = {}
    for n in seeds:
        d = root / f"seed{n}"
        entry = {"claims": [with_claim_fields(c) for c in json.loads((d / report / "claims.json").read_text())]}
        for name, rel in (("timings", "timings.json"), ("pi0_check", f"{report}/pi0_check.json")):
            if (d / rel).is_file():
                entry[name] = json.loads((d / rel).read_text())
        metrics = d / report / "metrics.json"
        split_rate = decomposition(json.loads(metrics.read_text())) if metrics.is_file() else None
        if split_rate is not None:
            entry["decomposition"] = split_rate
        per_seed[n] = entry
    summary = summarize_seeds(per_seed, draws=draws, seed=DEFAULT_SEED, order=[(c.trained, c.base) for c in CLAIMS])
    summary["split"] = split
    (root / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    path = root / "summary.md"
    path.write_text(seed_summary_markdown(summary), encoding="utf-8")
    for c in summary["claims"]:
        c = with_claim_fields(c)
        log(f"{c['kind']}: {claim_name(c)}: holds on {c['held']} of {c['seeds']} seeds; pooled {claim_interval(c)} "
            f"({VERDICT_TEXT[c['verdict']]})")
    return path


def points(x: float) -> str:
    """A fraction as signed percentage points: ``+4.20``."""
    return f"{100 * x:+.2f}"


SHORT_VERDICT = {"below": " (below 0)", "indistinguishable": " (not distinguishable from 0)"}
"""The mark of a claim that does not hold on a seed."""


def seed_summary_markdown(summary: dict) -> str:
    """The multi-seed tables: per seed, per claim pooled, and per claim and question type pooled
    (all three rendered into docs/demo.md)."""
    lines = [f"# MultiAgent-OPD on the tiny world: {len(summary['seeds'])} seeds ({summary['split']} split)", "",
             seed_table(summary), "", pooled_table(summary), ""]
    lines += per_dataset_section(summary)
    lines += [f"Per seed: each claim's {summary['claims'][0]['metric'] if summary['claims'] else 'avg@K'} "
              "difference with its question-bootstrap interval, marked where it does not hold (n/a: that "
              "seed did not evaluate the claim's systems). Pooled: the mean over seeds of each seed's macro "
              f"difference; interval: {summary['draws']:,} draws resampling seeds, then each drawn seed's "
              "questions within each dataset (paired), 2.5th-97.5th percentiles. A claim holds on a seed when "
              "that seed's question-bootstrap interval lies above 0."]
    return "\n".join(lines) + "\n"


def _decomposition_cell(e: dict) -> str:
    d = e.get("decomposition")
    if d is None:
        return "n/a"
    r = d["MultiAgent-OPD"]
    return f"{100 * r['multi_subtask']:.1f}% ({100 * r['multi_subtask_one_wave']:.1f}% in one output)"


def seed_table(summary: dict) -> str:
    """A row per seed: a column per claim in the summary's order (a failing one marked, n/a where the
    seed lacks it), the trained Leader's 2+-subtask rate on the pair questions its summary recorded
    (``DECOMPOSITION_DATASET`` now), pi_0's dev EM and the demo's time. Reads summaries written before claims had kinds."""
    claims = [with_claim_fields(c) for c in summary["claims"]]
    recorded = sorted({e["decomposition"]["dataset"] for e in summary["per_seed"].values() if e.get("decomposition")})
    split_on = ", ".join(recorded) or DECOMPOSITION_DATASET  # a summary of an older world names its own type
    head = (["seed"] + [f"{c['kind']}: {claim_name(c)}" for c in claims]
            + [f"MultiAgent-OPD Leader 2+ subtasks on {split_on}", "pi_0 dev EM", "demo time"])
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n, e in summary["per_seed"].items():
        cells = [str(n)]
        have = {(c["trained"], c["base"]): with_claim_fields(c) for c in e["claims"]}
        for claim in claims:
            c = have.get((claim["trained"], claim["base"]))
            cells.append("n/a" if c is None else claim_interval(c) + ("" if c["holds"] else SHORT_VERDICT[c["verdict"]]))
        cells.append(_decomposition_cell(e))
        chk = e.get("pi0_check")
        cells.append("n/a" if chk is None else f"{chk['em']:.3f}" + (" (weak)" if chk["weak"] else ""))
        tot = e.get("timings", {}).get("total")
        cells.append("n/a" if tot is None else f"{tot / 60:.1f} min")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def per_dataset_table(summary: dict) -> str:
    """A row per question type, a column per claim: the pooled difference on that type alone, with
    its interval (bold where the interval lies on one side of 0); "" for a summary written before
    claims had per-type pools."""
    claims = [with_claim_fields(c) for c in summary["claims"] if c.get("per_dataset")]
    if not claims:
        return ""
    datasets = sorted({d for c in claims for d in c["per_dataset"]})
    rows = ["| question type | " + " | ".join(f"{c['kind']}: {claim_name(c)}" for c in claims) + " |",
            "|" + "---|" * (len(claims) + 1)]
    for d in datasets:
        cells = []
        for c in claims:
            e = c["per_dataset"].get(d)
            text = "n/a" if e is None else claim_interval(e)
            cells.append(f"**{text}**" if e is not None and e["verdict"] != "indistinguishable" else text)
        rows.append(f"| {d} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def per_dataset_section(summary: dict) -> List[str]:
    """The per-type table with its one-line legend, as lines; none for an older summary."""
    table = per_dataset_table(summary)
    return ["Pooled over the seeds, per question type (the same bootstrap on one type's questions; bold: "
            "the interval lies on one side of 0):", "", table, ""] if table else []


def pooled_table(summary: dict) -> str:
    """A row per claim: its kind, on how many seeds it holds, the pooled difference and verdict."""
    metric = summary["claims"][0]["metric"] if summary["claims"] else "avg@K"
    rows = [f"| kind | claim | holds on | pooled {metric} difference | verdict |", "|---|---|---|---|---|"]
    for c in (with_claim_fields(c) for c in summary["claims"]):
        rows.append(f"| {c['kind']} | {claim_name(c)} | {c['held']} of {c['seeds']} seeds | {claim_interval(c)} | "
                    f"{VERDICT_TEXT[c['verdict']]} |")
    return "\n".join(rows)
