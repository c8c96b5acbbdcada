"""The built-in default, shortened: every stage runs, every artifact is written, the report renders."""

import dataclasses
import json
import math
import shutil

import pytest

from mopd.pipeline.run import spread_over_datasets
from mopd.recipes.tiny_world.demo import run_demo
from mopd.recipes.tiny_world.pipeline import DemoSettings
from tests.helpers.stamps import stamps


def _numbers(x):
    if isinstance(x, bool):
        return
    if isinstance(x, (int, float)):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _numbers(v)
    elif isinstance(x, list):
        for v in x:
            yield from _numbers(v)


def _records_without_timings(run_dir):
    rows = [json.loads(x) for x in (run_dir / "records.jsonl").read_text().splitlines()]
    for r in rows:
        r.pop("duration_s")
    return rows


@pytest.mark.slow
def test_quick_demo_end_to_end(tmp_path):
    out = tmp_path / "demo"
    s = DemoSettings(out=str(out), quick=True, stage1_steps=2, stage2_steps=2, test_questions=4, attempts=2,
                     bootstrap_draws=100)
    report = run_demo(s)
    assert report == out / "report" / "report.md"
    for rel in ("world/world.json", "world/corpus.jsonl", "world/questions/manifest.json", "world/index",
                "pi0/pi0.json", "pi0/config.json", "stage1/export/model.safetensors", "stage2/export/model.safetensors",
                "stage1/metrics.jsonl", "stage2/metrics.jsonl", "stage1/training.png", "stage2/training.png",
                "report/metrics.json", "report/per_dataset.png", "report/cost_accuracy.png",
                "report/validation.png", "timings.json"):
        assert (out / rel).exists(), rel
    runs = sorted(p.name for p in (out / "eval").iterdir())
    assert runs == ["c_mas_base", "c_mas_plus_rl", "h_mas_base", "multiagent_opd", "no_searcher_supervision"]
    for r in runs:
        lines = (out / "eval" / r / "records.jsonl").read_text().splitlines()
        assert len(lines) == 4 * 2
    metrics = json.loads((out / "report" / "metrics.json").read_text())
    assert all(math.isfinite(v) for v in _numbers(metrics))
    assert metrics["systems"] == ["C-MAS base", "C-MAS + RL", "H-MAS base", "MultiAgent-OPD", "No Searcher supervision"]
    for stage in ("stage1", "stage2", "stage2_no_searcher_supervision"):
        rows = [json.loads(x) for x in (out / stage / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [0, 1, 2]
        for r in rows:
            for k, v in r.items():
                assert not isinstance(v, str) or k == "time", (stage, k, v)   # non-finite values are logged as strings
    claims = json.loads((out / "report" / "claims.json").read_text())
    assert [(c["trained"], c["base"]) for c in claims] == [
        ("MultiAgent-OPD", "No Searcher supervision"), ("MultiAgent-OPD", "C-MAS + RL"),
        ("C-MAS + RL", "C-MAS base"), ("MultiAgent-OPD", "H-MAS base")]
    for c in claims:
        lo, hi = c["ci"]
        assert math.isfinite(c["diff"]) and lo <= c["diff"] <= hi and c["holds"] == (lo > 0)
    text = report.read_text()
    assert "## Main results" in text and "MultiAgent-OPD" in text and "per_dataset.png" in text
    # the second run reuses every finished stage; evaluating in one process gives the same records
    # as the two worker processes of the first run
    built = stamps(out)
    first = {r: _records_without_timings(out / "eval" / r) for r in runs}
    shutil.rmtree(out / "eval")
    run_demo(dataclasses.replace(s, eval_workers=1))
    assert stamps(out) == built          # world, pi_0, its check and both stages reused, not rebuilt
    assert {r: _records_without_timings(out / "eval" / r) for r in runs} == first


def test_spread_over_datasets():
    class Q:
        def __init__(self, d, i):
            self.dataset, self.id = d, i

    qs = [Q("a", 0), Q("a", 1), Q("a", 2), Q("b", 0), Q("b", 1)]
    assert [(q.dataset, q.id) for q in spread_over_datasets(qs, 3)] == [("a", 0), ("b", 0), ("a", 1)]
    assert len(spread_over_datasets(qs, 10)) == 5


def test_claims_are_paired_differences_of_avg(tmp_path):
    """check_claims against hand-made records: the trained system gets exactly 2 more attempts of 4 right
    on every question, so the paired difference is +0.5 in every draw (unpaired draws would spread it)."""
    from mopd.core.records import WorkflowRecord, write_records
    from mopd.recipes.tiny_world.report import check_claims

    def run(name, correct_per_q, workflow):
        recs = []
        for qi, n_right in enumerate(correct_per_q):
            for a in range(4):
                ans = "Norwick" if a < n_right else "Lorbury"
                recs.append(WorkflowRecord.from_dict({
                    "question_id": f"q{qi}", "dataset": "tiny_1hop" if qi % 2 else "tiny_2hop", "question": "Where?",
                    "answers": ["Norwick"], "workflow": workflow, "method": name, "attempt": a,
                    "final_answer": ans, "calls": [], "events": [], "candidates": [f"<answer>{ans}</answer>"]}))
        d = tmp_path / name
        d.mkdir()
        write_records(d / "records.jsonl", recs)
        return d

    base = [0, 1, 2, 1, 0, 2, 1, 2]
    runs = {"C-MAS base": run("cb", base, "cmas"), "C-MAS + RL": run("cr", [n + 2 for n in base], "cmas"),
            "H-MAS base": run("hb", base, "hmas"), "MultiAgent-OPD": run("mo", base[::-1], "hmas")}
    headline, c1, c2 = check_claims(runs, draws=200)
    assert (headline["kind"], headline["trained"], headline["base"]) == ("headline", "MultiAgent-OPD", "C-MAS + RL")
    assert headline["diff"] == pytest.approx(-0.5) and headline["verdict"] == "below" and not headline["holds"]
    assert c1["diff"] == pytest.approx(0.5) and c1["ci"] == pytest.approx([0.5, 0.5]) and c1["holds"]
    assert c2["diff"] == pytest.approx(0.0) and c2["ci"][0] < 0 < c2["ci"][1] and not c2["holds"]


def test_timings_keep_the_building_runs_stage_times_and_a_total_that_covers_them(tmp_path):
    from mopd.pipeline.run import write_timings as _write_timings

    path = tmp_path / "timings.json"
    # pi_0 was built by `mopd world pi0-check` (437.5 s in its pi0.json); this run reused it
    _write_timings(path, {"world": 7.25, "pi0": 0.5, "stage1": 400.0, "total": 420.0}, built={"pi0": 437.5})
    t = json.loads(path.read_text())
    assert (t["pi0"], t["stage1"], t["total"]) == (437.5, 400.0, 844.7)   # 7.2 + 437.5 + 400
    assert t["last_run"] == {"world": 7.2, "pi0": 0.5, "stage1": 400.0, "total": 420.0}
    # a re-run that reuses everything keeps the times of the runs that built the stages
    _write_timings(path, {"world": 0.1, "pi0": 0.2, "stage1": 1.0, "total": 2.0}, built={"pi0": 437.5})
    t2 = json.loads(path.read_text())
    assert {k: t2[k] for k in ("world", "pi0", "stage1", "total")} == {"world": 7.2, "pi0": 437.5, "stage1": 400.0,
                                                                       "total": 844.7}
    # a run that built Stage I again (with fewer steps, say) replaces its time, and the total follows
    _write_timings(path, {"world": 0.1, "pi0": 0.2, "stage1": 250.5, "total": 251.0}, built={"pi0": 437.5},
                   rebuilt={"stage1": True})
    t3 = json.loads(path.read_text())
    assert {k: t3[k] for k in ("world", "pi0", "stage1", "total")} == {"world": 7.2, "pi0": 437.5, "stage1": 250.5,
                                                                       "total": 695.2}
