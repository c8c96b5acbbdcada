"""Collapse table by hand, the report files, and `mopd eval report` end to end."""

import json

import pytest

from mopd.cli import main
from mopd.core.records import write_records
from mopd.eval.collapse import collapse_table
from mopd.eval.summary import summarize
from mopd.eval.plots import read_training_log, validation_curve_plot
from tests.helpers.eval_records import WRONG, make_record, right


def test_collapse_table_by_hand():
    step300 = [make_record("a", "d", 0, right(), searches=2, reports=1, subtasks=1, workflow="hmas"),
               make_record("b", "d", 0, WRONG, searches=0, empty_searches=0, reports=1, workflow="hmas"),
               make_record("c", "d", 0, None, blank_queries=1, workflow="hmas"),
               make_record("e", "d", 0, "Paris", searches=0, empty_searches=1, reports=1, subtasks=2,
                           workflow="hmas")]
    step400 = [make_record(x, "d", 0, right(), reports=1, subtasks=1, workflow="hmas") for x in "ab"]
    rows = collapse_table({400: step400, 300: step300})
    assert [r["step"] for r in rows] == [300, 400]
    r = rows[0]
    # searches: 2, 0, 0 (blank query is no action), 1 (an action that returned nothing)
    assert r["workflows"] == 4
    assert r["no_search_frac"] == pytest.approx(2 / 4)
    assert r["searches_per_workflow"] == pytest.approx(3 / 4)
    assert r["em"] == pytest.approx(1 / 4)
    assert r["final_answer_frac"] == pytest.approx(2 / 4)  # right() and WRONG have a valid tag
    assert r["reports_frac"] == pytest.approx(3 / 4)
    assert r["subtasks_and_reports_frac"] == pytest.approx(2 / 4)
    assert rows[1]["no_search_frac"] == 1.0 and rows[1]["em"] == 1.0 and rows[1]["final_answer_frac"] == 1.0


def test_validation_curves_tolerate_a_truncated_last_line(tmp_path):
    log = tmp_path / "run1" / "metrics.jsonl"
    log.parent.mkdir()
    log.write_text("\n".join(json.dumps({"step": s, "val/em": s / 100, "train/loss": 1.0}) for s in (10, 20))
                   + '\n{"step": 3')
    assert [r["step"] for r in read_training_log(log)] == [10, 20]
    out = validation_curve_plot([log], tmp_path / "v.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="none of"):
        validation_curve_plot([log], tmp_path / "w.png", keys=("val/acc",))


def _run_dir(tmp_path, name, workflow, right_attempts, qids=("q1", "q2", "q3")):
    recs = [make_record(q, "nq" if q != "q3" else "hq", a, right() if a < right_attempts else WRONG,
                        workflow=workflow, searches=1 + a, subtasks=1 if workflow == "hmas" else 0,
                        input_tokens=1000, output_tokens=100)
            for q in qids for a in range(4)]
    d = tmp_path / name
    write_records(d / "records.jsonl", recs)
    return d


def test_eval_report_cli_writes_report_metrics_and_plots(tmp_path, capsys):
    opd = _run_dir(tmp_path, "opd", "hmas", 3)
    cmas = _run_dir(tmp_path, "cmas", "cmas", 1)
    log = tmp_path / "metrics.jsonl"
    log.write_text(json.dumps({"step": 10, "val/em": 0.3, "rollout/no_search_frac": 0.0}) + "\n")
    out = tmp_path / "rep"
    rc = main(["eval", "report", str(opd), str(cmas), "--names", "MultiAgent-OPD", "C-MAS + RL",
               "--out", str(out), "--draws", "300", "--collapse", f"100={cmas}", f"200={opd}",
               "--val-log", str(log)])
    assert rc == 0
    m = json.loads((out / "metrics.json").read_text())
    assert m["protocol"]["reference"] == "MultiAgent-OPD" and m["protocol"]["bootstrap_draws"] == 300
    assert m["accuracy"]["strict"]["MultiAgent-OPD"]["macro"]["avg@4"]["value"] == pytest.approx(0.75)
    assert m["accuracy"]["strict"]["C-MAS + RL"]["macro"]["avg@4"]["diff_vs_reference"] == pytest.approx(0.5)
    assert m["costs"]["C-MAS + RL"]["task_assignments_applicable"] is False
    assert m["costs"]["MultiAgent-OPD"]["macro"]["search_actions"] == pytest.approx(2.5)
    assert [r["step"] for r in m["collapse"]] == [100, 200]
    assert set(m["figures"]) == {"per_dataset", "cost_accuracy", "validation"}
    for png in ("per_dataset.png", "cost_accuracy.png", "validation.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    md = (out / "report.md").read_text()
    assert "| MultiAgent-OPD | 75.00 [" in md
    assert "| MultiAgent-OPD - C-MAS + RL | +50.00 [+50.00, +50.00]" in md
    assert "| n/a |" in md  # C-MAS task assignments
    assert "## Search collapse" in md and "![validation curves](validation.png)" in md
    assert "report.md" in capsys.readouterr().out


def test_eval_report_cli_errors_are_one_line(tmp_path, capsys):
    a = _run_dir(tmp_path, "a", "cmas", 2)
    b = _run_dir(tmp_path, "b", "cmas", 2, qids=("q1", "q2"))
    assert main(["eval", "report", str(a), str(b), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "system 'b' has no record of question hq/q3" in err and "Traceback" not in err
    assert main(["eval", "report", str(a), str(b), "--out", str(tmp_path / "r"), "--intersect",
                 "--no-plots", "--draws", "50"]) == 0
    m = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert m["protocol"]["dropped_records"] == {"a": 4, "b": 0}
    assert main(["eval", "report", str(a), "--names", "x", "y"]) == 2
    assert main(["eval", "report", str(a), "--collapse", "abc"]) == 2
    assert main(["eval", "report", str(a), "--reference", "zzz", "--out", str(tmp_path / "r2")]) == 2
    assert "reference system 'zzz'" in capsys.readouterr().err


def test_validation_table_lists_every_validation_of_every_run(tmp_path):
    """Two runs that validated at different steps; training rows without val/em are not rows; a
    non-finite value (logged as a string) is left blank."""
    from mopd.eval.report import render_markdown, validation_rows

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("\n".join(json.dumps(r) for r in [
        {"step": 0, "val/em": 0.5, "val/no_search_frac": 0.25, "val/search_per_workflow": 1.125},
        {"step": 3, "train/loss": 1.0},
        {"step": 5, "val/em": 0.625, "val/no_search_frac": 0.125, "val/search_per_workflow": 1.875}]) + "\n")
    b.write_text("\n".join(json.dumps(r) for r in [
        {"step": 10, "val/em": 0.375, "val/no_search_frac": "nan", "val/search_per_workflow": 0.0},
        {"step": 5, "val/em": 0.25, "val/no_search_frac": 0.75, "val/search_per_workflow": 0.5}]) + "\n")
    rows = validation_rows([a, b], ["Arm A", "Arm B"])
    assert [r["step"] for r in rows["Arm A"]] == [0, 5] and [r["step"] for r in rows["Arm B"]] == [5, 10]
    assert "val/no_search_frac" not in rows["Arm B"][1]
    opd = [make_record("q1", "nq", k, right(), workflow="hmas", searches=1) for k in range(2)]
    summary = summarize({"S": opd}, draws=10)
    summary["validation"] = rows
    md = render_markdown(summary)
    part = md.split("## Validation over training", 1)[1]
    assert "| Step | Arm A | Arm B |" in part
    assert "| 0 | 50.0 |  |" in part and "| 5 | 62.5 | 25.0 |" in part and "| 10 |  | 37.5 |" in part
    assert "| 5 | 12.5 | 75.0 |" in part and "| 10 |  |  |" in part        # no-search: the nan is blank
    assert "| 0 | 1.12 |  |" in part and "| 5 | 1.88 | 0.50 |" in part    # searches per workflow


def test_validation_section_is_left_out_when_no_log_validated(tmp_path):
    from mopd.eval.report import render_markdown, validation_rows

    log = tmp_path / "m.jsonl"
    log.write_text(json.dumps({"step": 1, "train/loss": 2.0}) + "\n")
    summary = summarize({"S": [make_record("q1", "nq", 0, right())]}, draws=10)
    summary["validation"] = validation_rows([log], ["run"])
    assert summary["validation"] == {"run": []}
    assert "## Validation over training" not in render_markdown(summary)
