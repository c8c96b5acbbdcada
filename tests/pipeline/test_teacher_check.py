"""The teacher checked before it teaches: the Stage-I export against the base on dev per question
type, the table in the report and a one-line warning where the teacher lost a type a distilled
Searcher trains on (mopd/pipeline/teacher_check.py)."""

import json
import random

import pytest

from mopd.cli import main
from mopd.pipeline.config import TeacherCheckSettings
from mopd.pipeline.stages import EvalStage
from mopd.pipeline.teacher_check import TeacherCheckStage, compare, markdown, run_check
from mopd.pipeline.teacher_check import plan_with_check as plan
from mopd.pipeline.teacher_check import distills_searcher
from mopd.config import resolve
from mopd.core.records import AgentCall, WorkflowRecord
from tests.helpers.dry_run import refuse_loading


def _records(accuracy, sizes, attempts, rng):
    """Records of one system: per dataset, ``sizes[d]`` questions x ``attempts``, each attempt right
    with probability ``accuracy[d]``; returns the records and the correct count per dataset."""
    out, right = [], {}
    for d, n in sizes.items():
        right[d] = 0
        for q in range(n):
            for a in range(attempts):
                ok = rng.random() < accuracy[d]
                right[d] += ok
                out.append(WorkflowRecord(question_id=f"{d}-{q}", dataset=d, question=f"q {q}?", answers=["Ashford"],
                                          attempt=a, calls=[AgentCall("s0", "searcher")],
                                          candidates=["<answer>Ashford</answer>" if ok else "<answer>Lyme</answer>"]))
    return out, right


def _pair(rng, sizes, attempts, base_acc, teacher_acc):
    base, b_right = _records(base_acc, sizes, attempts, rng)
    teacher, t_right = _records(teacher_acc, sizes, attempts, rng)
    return base, teacher, b_right, t_right


def test_a_teacher_that_lost_a_trained_type_is_warned_about():
    rng = random.Random(7)
    sizes, k = {"tiny_1hop": 23, "tiny_2hop": 17, "tiny_pair_towns": 11}, 3
    base, teacher, b, t = _pair(rng, sizes, k, {"tiny_1hop": 0.75, "tiny_2hop": 0.3, "tiny_pair_towns": 0.5},
                                {"tiny_1hop": 0.35, "tiny_2hop": 0.8, "tiny_pair_towns": 0.5})
    check = compare(base, teacher, trained_types=list(sizes), distilled_by=["MultiAgent-OPD"], draws=200)
    rows = {r["type"]: r for r in check["types"]}
    assert sorted(rows) == sorted(sizes) and check["attempts"] == k
    for d, n in sizes.items():   # avg@K strict EM per type, from the hand-built outcomes
        assert rows[d]["questions"] == n
        assert rows[d]["base"] == pytest.approx(b[d] / (n * k)) and rows[d]["teacher"] == pytest.approx(t[d] / (n * k))
        assert rows[d]["difference"] == pytest.approx(rows[d]["teacher"] - rows[d]["base"])
        assert rows[d]["ci"][0] <= rows[d]["difference"] <= rows[d]["ci"][1]
        assert rows[d]["lost"] == (t[d] < b[d])
    assert rows["tiny_1hop"]["lost"] and not rows["tiny_2hop"]["lost"]
    line = check["warning"]
    assert line and "\n" not in line and "tiny_1hop" in line and "tiny_2hop" not in line and "MultiAgent-OPD" in line
    assert f"{100 * rows['tiny_1hop']['teacher']:.2f} vs {100 * rows['tiny_1hop']['base']:.2f}" in line
    assert all(d in line for d, r in rows.items() if r["lost"])
    md = markdown(check)
    assert "**Warning:**" in md and line in md and md.count("\n| tiny_") == 3 and "**worse**" in md


def test_no_warning_without_a_lost_trained_type_or_a_distilled_searcher():
    rng = random.Random(3)
    sizes = {"a": 9, "b": 13}
    base, teacher, _, _ = _pair(rng, sizes, 2, {"a": 0.9, "b": 0.2}, {"a": 0.1, "b": 0.9})
    lost_untrained = compare(base, teacher, trained_types=["b"], distilled_by=["MultiAgent-OPD"], draws=50)
    assert [r["lost"] for r in lost_untrained["types"]] == [True, False] and lost_untrained["warning"] is None
    nobody_distils = compare(base, teacher, trained_types=["a", "b"], distilled_by=[], draws=50)
    assert nobody_distils["warning"] is None
    assert "No warning" in markdown(nobody_distils) and "Searcher distilled from it: no arm" in markdown(nobody_distils)


def test_run_check_writes_the_table_and_the_stage_says_the_warning(tmp_path, monkeypatch):
    rng = random.Random(11)
    sizes = {"nq": 7, "hotpotqa": 5}
    base, teacher, _, _ = _pair(rng, sizes, 4, {"nq": 0.9, "hotpotqa": 0.1}, {"nq": 0.1, "hotpotqa": 0.9})
    for name, recs in (("base", base), ("teacher", teacher)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "records.jsonl").write_text("".join(json.dumps(r.to_dict()) + "\n" for r in recs))
        (tmp_path / name / ".done").write_text(name)
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"id": str(i), "question": f"q{i}?", "golden_answers": ["x"], "dataset": d})
                             + "\n" for i, d in enumerate(["nq", "nq", "triviaqa"])))
    check = run_check(tmp_path / "base", tmp_path / "teacher", tmp_path / "out", ["nq", "triviaqa"], ["MultiAgent-OPD"])
    assert json.loads((tmp_path / "out" / "teacher_check.json").read_text())["warning"] == check["warning"]
    assert "nq" in check["warning"] and "hotpotqa" not in check["warning"]   # hotpotqa: gained, and not trained
    assert check["warning"] in (tmp_path / "out" / "teacher_check.md").read_text()

    monkeypatch.setattr("mopd.pipeline.teacher_check.check_live_owner", lambda key: None)
    stage = TeacherCheckStage("teacher_check", "teacher_check", "t", outputs=[str(tmp_path / "stage")],
                              base=EvalStage("b", "teacher_check", "b", outputs=[str(tmp_path / "base")]),
                              teacher=EvalStage("t", "teacher_check", "t", outputs=[str(tmp_path / "teacher")]),
                              train_data=str(train), distilled=["MultiAgent-OPD"])
    said = []
    assert not stage.done()
    assert stage.run(said.append)["warning"] == check["warning"] and said == [check["warning"]]
    assert stage.done()   # reused while its evaluations are unchanged
    stage.run(said.append)
    assert said[-1] == check["warning"] and "reusing" in said[-2]
    (tmp_path / "teacher" / ".done").write_text("another teacher")
    assert not stage.done()


def test_the_searcher_distilled_from_its_teacher():
    assert distills_searcher(resolve("tiny_mopd")) and distills_searcher(resolve("mopd"))
    for preset in ("tiny_no_searcher_supervision", "tiny_outcome_searcher", "prompted_critic"):
        assert not distills_searcher(resolve(preset)), preset


def test_the_check_runs_between_stage1_and_the_arms(tiny):
    stages = plan(tiny)
    keys = [s.key for s in stages]
    i = keys.index("teacher_check")
    assert keys[i - 2:i] == ["teacher_check.base", "teacher_check.teacher"]
    assert keys.index("stage1.export") < i - 2 and i < keys.index("stage2.mopd")
    check = next(s for s in stages if isinstance(s, TeacherCheckStage))
    assert check.distilled == ["MultiAgent-OPD"]
    assert check.base.manifest == tiny.data.dev and check.teacher.model_dir.endswith("stage1/export")
    assert check.base.system.workflow == check.teacher.system.workflow == "cmas"
    report = stages[-1]
    assert report.sections == [str(check.markdown_path)] and str(check.markdown_path) in report.setup_files
    # evaluated on dev: the check is the evaluation of C-MAS base and C-MAS + RL, before the arms
    tiny.eval.split = "dev"
    stages = plan(tiny)
    keys = [s.key for s in stages]
    assert "teacher_check.base" not in keys and keys.count("eval.c_mas_base") == 1
    assert keys.index("eval.c_mas_base") < keys.index("eval.c_mas_plus_rl") < keys.index("teacher_check") \
        < keys.index("stage2.mopd") < keys.index("eval.multiagent_opd")
    tiny.teacher_check = TeacherCheckSettings(enabled=False)
    assert not [s for s in plan(tiny) if s.group == "teacher_check" or isinstance(s, TeacherCheckStage)]


def test_a_lora_stage1s_adapter_is_the_checked_teacher(tiny):
    for spec in (tiny.stage1, *tiny.stage2.values()):
        spec.overrides += ["model.lora.rank=4", "model.lora.alpha=8", "trainer.lr=5e-3"]
    stages = plan(tiny)
    check = next(s for s in stages if isinstance(s, TeacherCheckStage))
    # the arm distils from the adapter export; the check evaluates the merged export (the same model)
    assert check.distilled == ["MultiAgent-OPD"] and check.teacher.model_dir.endswith("stage1/export")
    keys = [s.key for s in stages]
    assert keys.index("stage1.export_adapter") < keys.index("teacher_check") < keys.index("stage2.mopd")


def test_no_check_without_dev_or_arms(tiny):
    tiny.data.dev = ""
    assert not [s for s in plan(tiny) if isinstance(s, TeacherCheckStage)]
    tiny.data.dev, tiny.stage2 = tiny.data.test, {}
    tiny.systems = tiny.systems[:2]
    assert not [s for s in plan(tiny) if isinstance(s, TeacherCheckStage)]


def test_the_dry_runs_list_the_check(monkeypatch, capsys, tmp_path):
    refuse_loading(monkeypatch)
    assert main(["pipeline", "paper", "--dry-run", f"root={tmp_path}/paper"]) == 0
    out = capsys.readouterr().out
    for key in ("teacher_check.base", "teacher_check.teacher", "teacher_check"):
        assert f"] {key}: " in out, key
    assert out.index("] teacher_check: ") < out.index("] stage2.mopd: ")
    assert f"--section {tmp_path}/paper/teacher_check/teacher_check.md" in out
    assert main(["pipeline", "demo", "--dry-run", f"root={tmp_path}/demo"]) == 0
    out = capsys.readouterr().out
    assert "] teacher_check: teacher check: the Stage-I teacher against the base on dev" in out
    assert "teacher check: the base model on dev, cmas, dev questions x 4 attempts" in out


@pytest.mark.parametrize("bad", ["teacher_check.attempts=0", "teacher_check.questions=-1", "teacher_check.dir=/x"])
def test_bad_settings_are_one_line_errors(bad, capsys):
    assert main(["pipeline", "paper", "--dry-run", bad]) != 0
    err = capsys.readouterr().err
    assert "teacher_check." in err and "Traceback" not in err

