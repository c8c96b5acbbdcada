"""The demo's claims (order, kinds, verdicts, left out when a system is missing), the report's
Claims section, and the multi-seed summary's tables."""

import json

import pytest

from mopd.core.records import Event, WorkflowRecord, write_records
from mopd.recipes.tiny_world.report import (CLAIMS, ReportInputs, check_claims, claims_table, verdict, with_claim_fields,
                              write_report)

BASE = [0, 1, 2, 1, 0, 2, 1, 2]
"""Correct attempts (of 4) per question of the base systems; questions alternate two datasets."""


def _run(tmp_path, name, correct_per_q, workflow, subtasks=1):
    recs = []
    for qi, n_right in enumerate(correct_per_q):
        for a in range(4):
            ans = "Norwick" if a < n_right else "Lorbury"
            events = [Event("subtask", 1, call_id="l0", text=f"s{i}") for i in range(subtasks if workflow == "hmas" else 0)]
            events += [Event("search", 2, call_id="s0.0", text="q")] * (qi % 3)
            recs.append(WorkflowRecord(
                question_id=f"q{qi}", dataset="tiny_pair_towns" if qi % 2 else "tiny_2hop", question="Where?",
                answers=["Norwick"], workflow=workflow, method=name, attempt=a, final_answer=ans,
                events=events, candidates=[f"<answer>{ans}</answer>"]))
    d = tmp_path / name.lower().replace(" ", "_").replace("+", "plus")
    write_records(d / "records.jsonl", recs)
    return d


def _systems(tmp_path, with_control=True, with_ablation=True):
    runs = {"C-MAS base": _run(tmp_path, "C-MAS base", BASE, "cmas"),
            "C-MAS + RL": _run(tmp_path, "C-MAS + RL", [n + 2 for n in BASE], "cmas"),
            "H-MAS base": _run(tmp_path, "H-MAS base", BASE, "hmas"),
            "MultiAgent-OPD": _run(tmp_path, "MultiAgent-OPD", [n + 1 for n in BASE], "hmas", subtasks=2)}
    if with_control:
        # the reversed base plus one: per-question differences -2..2 that cancel in each dataset's sum
        runs["No Searcher supervision"] = _run(tmp_path, "No Searcher supervision", [n + 1 for n in BASE[::-1]],
                                               "hmas")
    if with_ablation:
        runs["Outcome Searcher"] = _run(tmp_path, "Outcome Searcher", BASE, "hmas")
    return runs


def test_verdict_words():
    assert verdict([0.01, 0.2]) == "above" and verdict([-0.3, -0.001]) == "below"
    assert verdict([-0.1, 0.1]) == "indistinguishable" and verdict([0.0, 0.1]) == "indistinguishable"


def test_claims_in_order_with_kind_label_and_an_honest_verdict(tmp_path):
    claims = check_claims(_systems(tmp_path), draws=300)
    assert [(c["kind"], c["trained"], c["base"]) for c in claims] == [
        ("primary", "MultiAgent-OPD", "No Searcher supervision"), ("headline", "MultiAgent-OPD", "C-MAS + RL"),
        ("check", "C-MAS + RL", "C-MAS base"), ("check", "MultiAgent-OPD", "H-MAS base"),
        ("ablation", "MultiAgent-OPD", "Outcome Searcher")]          # no Base teacher run: left out
    primary, headline, stage1, stage2, ablation = claims
    assert primary["diff"] == pytest.approx(0.0) and primary["ci"][0] < 0 < primary["ci"][1]
    assert primary["verdict"] == "indistinguishable" and not primary["holds"]
    # every question one attempt fewer right than C-MAS + RL: below 0 in every draw, and still reported
    assert headline["diff"] == pytest.approx(-0.25) and headline["ci"] == pytest.approx([-0.25, -0.25])
    assert headline["verdict"] == "below" and not headline["holds"]
    assert stage1["diff"] == pytest.approx(0.5) and stage1["verdict"] == "above" and stage1["holds"]
    assert stage2["diff"] == pytest.approx(0.25) and ablation["diff"] == pytest.approx(0.25)
    for c in claims:
        assert set(c) == {"kind", "label", "trained", "base", "metric", "diff", "ci", "holds", "verdict", "questions"}
        assert c["metric"] == "avg@4" and len(c["questions"]) == 8 and c["label"]
    assert [q["trained"] - q["base"] for q in headline["questions"]] == pytest.approx([-0.25] * 8)


def test_claims_of_older_runs_leave_out_what_they_did_not_evaluate(tmp_path):
    claims = check_claims(_systems(tmp_path, with_control=False, with_ablation=False), draws=50)
    assert [c["kind"] for c in claims] == ["headline", "check", "check"]
    assert [c.kind for c in CLAIMS][:4] == ["primary", "headline", "check", "check"]


def test_report_has_the_claims_first_and_the_logs_say_them(tmp_path, capsys):
    runs = _systems(tmp_path)
    log = tmp_path / "metrics.jsonl"
    log.write_text("\n".join(json.dumps({"step": s, "val/em": 0.1 * s, "val/no_search_frac": 0.5 - 0.1 * s,
                                         "val/search_per_workflow": 1.0 + s}) for s in (0, 1, 2)) + "\n")
    report = write_report(list(runs.values()), list(runs), tmp_path / "report",
                          ReportInputs(logs=[log], labels=["Stage II (MultiAgent-OPD)"], draws=200))
    md = report.read_text()
    assert md.index("## Claims") < md.index("## Main results")
    claims_part = md.split("## Claims", 1)[1].split("## Main results", 1)[0]
    rows = [line for line in claims_part.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 5
    assert rows[0].startswith("| 1 | primary | MultiAgent-OPD minus No Searcher supervision: ")
    assert rows[0].endswith("| not distinguishable from 0 |")
    assert rows[1].startswith("| 2 | headline | MultiAgent-OPD minus C-MAS + RL: ")
    assert rows[1].endswith("| **-25.00 [-25.00, -25.00]** | below 0 |")
    assert rows[2].endswith("| **+50.00 [+50.00, +50.00]** | above 0 (holds) |")
    saved = json.loads((tmp_path / "report" / "claims.json").read_text())
    assert [c["verdict"] for c in saved] == [c["verdict"] for c in check_claims(runs, draws=200)]
    err = capsys.readouterr().err
    assert "claim headline (the paper's headline comparison): MultiAgent-OPD minus C-MAS + RL, avg@4 " \
           "-25.00 [-25.00, -25.00] -> below 0 (does NOT hold)" in err
    # role activity: MultiAgent-OPD's Leader delegates 2 subtasks in one output everywhere, the
    # other H-MAS systems 1; a cascade has no Leader
    part = md.split("## Role activity by question type", 1)[1]
    assert "| MultiAgent-OPD | 100.0 | 100.0 | 100.0 |" in part and "| H-MAS base | 0.0 | 0.0 | 0.0 |" in part
    assert "| C-MAS + RL | n/a | n/a | n/a |" in part
    m = json.loads((tmp_path / "report" / "metrics.json").read_text())
    assert m["activity"]["MultiAgent-OPD"]["per_dataset"]["tiny_pair_towns"]["multi_subtask_one_wave"] == 1.0
    assert [r["step"] for r in m["validation"]["Stage II (MultiAgent-OPD)"]] == [0, 1, 2]
    assert "| 2 | 30.0 |" in md.split("## Validation over training", 1)[1]   # no-search at step 2


def test_claims_table_labels_records_written_before_kinds_existed():
    old = [{"trained": "C-MAS + RL", "base": "C-MAS base", "metric": "avg@4", "diff": 0.35, "ci": [0.3, 0.4],
            "holds": True},
           {"trained": "X", "base": "Y", "metric": "avg@4", "diff": -0.01, "ci": [-0.05, 0.03], "holds": False}]
    rows = claims_table(old).splitlines()[2:]
    assert rows == ["| 1 | check | C-MAS + RL minus C-MAS base: Stage I training works | **+35.00 [+30.00, +40.00]** | "
                    "above 0 (holds) |",
                    "| 2 | claim | X minus Y: X minus Y | **-1.00 [-5.00, +3.00]** | not distinguishable from 0 |"]


def _claim(trained, base, diff, ci, n=6, new=True):
    qs = [{"dataset": "tiny_pair_towns" if i % 2 else "tiny_1hop", "id": f"q{i}", "base": 0.25, "trained": 0.25 + diff}
          for i in range(n)]
    c = {"trained": trained, "base": base, "metric": "avg@4", "diff": diff, "ci": ci, "holds": ci[0] > 0,
         "questions": qs}
    return with_claim_fields(c) if new else c


def _seed_dir(root, n, claims, activity=None):
    d = root / f"seed{n}" / "report"
    d.mkdir(parents=True)
    (d / "claims.json").write_text(json.dumps(claims))
    if activity is not None:
        (d / "metrics.json").write_text(json.dumps({"activity": activity}))
    (root / f"seed{n}" / "timings.json").write_text(json.dumps({"total": 60.0 * n}))


def test_seed_summary_reads_older_claims_and_shows_every_claim_in_order(tmp_path):
    from mopd.recipes.tiny_world.report import write_seed_summary

    # seed 1: an older run (claims.json without kind/label, no role activity in metrics.json)
    _seed_dir(tmp_path, 1, [_claim("C-MAS + RL", "C-MAS base", 0.3, [0.25, 0.35], new=False),
                            _claim("MultiAgent-OPD", "H-MAS base", 0.2, [0.15, 0.25], new=False)])
    # seed 2: the new claims, the primary and the headline failing
    act = {"MultiAgent-OPD": {"per_dataset": {"tiny_pair_towns": {"multi_subtask": 0.8125, "multi_subtask_one_wave": 0.5}}},
           "H-MAS base": {"per_dataset": {"tiny_pair_towns": {"multi_subtask": 0.25, "multi_subtask_one_wave": 0.125}}}}
    _seed_dir(tmp_path, 2, [_claim("MultiAgent-OPD", "No Searcher supervision", 0.01, [-0.02, 0.04]),
                            _claim("MultiAgent-OPD", "C-MAS + RL", -0.1, [-0.15, -0.05]),
                            _claim("C-MAS + RL", "C-MAS base", 0.2, [0.1, 0.3]),
                            _claim("MultiAgent-OPD", "H-MAS base", 0.1, [0.05, 0.15])], activity=act)
    path = write_seed_summary(tmp_path, [1, 2], draws=100)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [(c["kind"], c["base"], c["seeds"], c["held"]) for c in summary["claims"]] == [
        ("primary", "No Searcher supervision", 1, 0), ("headline", "C-MAS + RL", 1, 0),
        ("check", "C-MAS base", 2, 2), ("check", "H-MAS base", 2, 2)]
    assert summary["claims"][2]["diff"] == pytest.approx(0.25)         # the mean of 0.3 and 0.2
    assert summary["per_seed"]["2"]["decomposition"] == {
        "dataset": "tiny_pair_towns", "MultiAgent-OPD": {"multi_subtask": 0.8125, "multi_subtask_one_wave": 0.5},
        "H-MAS base": {"multi_subtask": 0.25, "multi_subtask_one_wave": 0.125}}
    assert "decomposition" not in summary["per_seed"]["1"]
    md = path.read_text()
    lines = md.splitlines()
    head = next(line for line in lines if line.startswith("| seed |"))
    assert head == ("| seed | primary: MultiAgent-OPD minus No Searcher supervision | headline: MultiAgent-OPD minus "
                    "C-MAS + RL | check: C-MAS + RL minus C-MAS base | check: MultiAgent-OPD minus H-MAS base | "
                    "MultiAgent-OPD Leader 2+ subtasks on tiny_pair_towns | pi_0 dev EM | demo time |")
    assert "| 1 | n/a | n/a | +30.00 [+25.00, +35.00] | +20.00 [+15.00, +25.00] | n/a | n/a | 1.0 min |" in lines
    assert ("| 2 | +1.00 [-2.00, +4.00] (not distinguishable from 0) | -10.00 [-15.00, -5.00] (below 0) | "
            "+20.00 [+10.00, +30.00] | +10.00 [+5.00, +15.00] | 81.2% (50.0% in one output) | n/a | 2.0 min |") in lines
    assert "| headline | MultiAgent-OPD minus C-MAS + RL | 0 of 1 seeds | -10.00 [-10.00, -10.00] | below 0 |" in lines
    assert "| check | C-MAS + RL minus C-MAS base | 2 of 2 seeds | +25.00 [+20.00, +30.00] | above 0 |" in lines


def test_seed_summary_of_the_committed_older_seed_reports(tmp_path):
    """docs/demo_seeds/seedN as committed before claims had kinds (and metrics.json had role
    activity): summarised without error, labelled from their systems, the Leader rate n/a."""
    import shutil
    from pathlib import Path

    from mopd.recipes.tiny_world.report import write_seed_summary

    docs = Path(__file__).resolve().parents[3] / "docs" / "demo_seeds_chain_world"
    for n in (1, 2):
        (tmp_path / f"seed{n}" / "report").mkdir(parents=True)
        for name in ("claims.json", "metrics.json"):
            shutil.copy2(docs / f"seed{n}" / name, tmp_path / f"seed{n}" / "report" / name)
    md = write_seed_summary(tmp_path, [1, 2], draws=50).read_text()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [(c["kind"], c["label"]) for c in summary["claims"]] == [("check", "Stage I training works"),
                                                                      ("check", "Stage II training works")]
    assert "| 1 | +30.87 [+26.63, +35.00] | +22.50 [+18.50, +26.63] | n/a | n/a | n/a |" in md


def test_seed_summary_shows_each_claim_per_question_type(tmp_path):
    from mopd.recipes.tiny_world.report import write_seed_summary

    for n, shift in ((1, 0.1), (2, 0.3)):
        c = _claim("MultiAgent-OPD", "No Searcher supervision", shift, [shift - 0.05, shift + 0.05])
        c["questions"] = ([{"dataset": "tiny_2hop", "id": f"a{i}", "base": 0.25, "trained": 0.25 + shift} for i in range(6)]
                          + [{"dataset": "tiny_pair_towns", "id": f"b{i}", "base": 0.5, "trained": 0.5} for i in range(6)])
        _seed_dir(tmp_path, n, [c])
    lines = write_seed_summary(tmp_path, [1, 2], draws=50).read_text().splitlines()
    assert "| question type | primary: MultiAgent-OPD minus No Searcher supervision |" in lines
    assert "| tiny_2hop | **+20.00 [+10.00, +30.00]** |" in lines     # seeds resampled: 0.1 or 0.3
    assert "| tiny_pair_towns | +0.00 [+0.00, +0.00] |" in lines
