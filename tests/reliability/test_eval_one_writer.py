"""One writer per evaluation: `mopd eval run` holds the lock training holds on
its --out, so a second one is refused naming the first; a continued evaluation with an edited
manifest is refused in one line (a larger --limit of the same manifest continues); a records file
never keeps two records of one workflow; `eval report` refuses systems whose records share ids
and gold answers but not question texts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mopd.cli import main
from mopd.core.qa import QAExample
from mopd.core.records import read_records, write_records
from mopd.eval.alignment import EvalError, align_runs
from mopd.eval.runner import EvalPlan, manifest_fingerprint, read_finished, run_evaluation
from mopd.rollout.run_state import WorkflowSettings
from mopd.config import Config
from tests.helpers.eval_records import make_record, right
from tests.reliability.runs import small_index


def _questions(n, text="Q{i}?"):
    return [QAExample(id=f"q{i}", dataset="nq", question=text.format(i=i), answers=["Paris"]) for i in range(n)]


def _fake_rollout(calls):
    def run(engine, retriever, tokenizer, questions, settings, *, attempts, method="", progress=True):
        calls.append([q.id for q in questions])
        return [make_record(q.id, q.dataset, a, right()) for q in questions for a in range(attempts)]
    return run


def _plan(out, attempts=2, **kw):
    return EvalPlan(out, WorkflowSettings.for_evaluation(Config(), "cmas"), attempts=attempts, **kw)


@pytest.fixture
def holder(tmp_path):
    """Another process that holds the evaluation's lock on ``tmp_path/out`` (as a running `mopd eval run`)."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", "import time\nfrom mopd.core.run_lock import RunLock\n"
                             f"lock = RunLock({str(out)!r}, 'mopd eval run'); print('held', flush=True); "
                             "time.sleep(600)"],
                            stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=os.getcwd()))
    try:
        assert proc.stdout.readline().strip() == "held"
        yield out, proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_a_second_evaluation_into_one_out_is_refused_naming_the_first(holder):
    out, pid = holder
    calls = []
    with pytest.raises(EvalError) as e:
        run_evaluation(None, None, None, _questions(3), _plan(out), run_fn=_fake_rollout(calls))
    assert f"is in use by pid {pid} (mopd eval run)" in str(e.value) and "\n" not in str(e.value)
    assert calls == [] and sorted(p.name for p in out.iterdir()) == [".mopd.lock"]


def test_mopd_eval_run_is_refused_before_its_engine_loads(holder, tiny_model_dir, qa_file, tmp_path, capsys,
                                                          monkeypatch):
    out, pid = holder
    import mopd.rollout.engines as engines

    def no_engine(*a, **k):
        raise AssertionError("the engine loaded")

    monkeypatch.setattr(engines, "build_engine", no_engine)
    monkeypatch.setenv("MOPD_CACHE", str(tmp_path / "cache"))
    capsys.readouterr()
    rc = main(["eval", "run", "--model", tiny_model_dir, "--workflow", "cmas", "--manifest", qa_file,
               "--attempts", "1", "--out", str(out), f"retriever.index={small_index(tmp_path)}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("mopd eval: error: ") and "\n" not in err, err
    assert f"is in use by pid {pid} (mopd eval run)" in err, err


def test_each_evaluation_takes_the_lock_and_gives_it_back(tmp_path):
    calls = []
    run_evaluation(None, None, None, _questions(2), _plan(tmp_path / "a"), run_fn=_fake_rollout(calls))
    run_evaluation(None, None, None, _questions(3), _plan(tmp_path / "a"), run_fn=_fake_rollout(calls))
    assert calls == [["q0", "q1"], ["q2"]]          # the second one took the lock again and continued
    with pytest.raises(EvalError, match="other settings"):
        run_evaluation(None, None, None, _questions(1), _plan(tmp_path / "a", attempts=3), run_fn=_fake_rollout(calls))
    assert len(read_records(tmp_path / "a" / "records.jsonl")) == 6


def test_a_continued_evaluation_with_an_edited_manifest_is_refused_in_one_line(tmp_path):
    out, calls = tmp_path / "out", []
    run_evaluation(None, None, None, _questions(4), _plan(out, manifest=manifest_fingerprint(_questions(4))),
                   run_fn=_fake_rollout(calls))
    for edited in (_questions(4, text="Where is Q{i}?"),                                   # another text
                   [QAExample(q.id, q.dataset, q.question, ["Lyon"]) for q in _questions(4)]):   # other gold
        with pytest.raises(EvalError) as e:
            run_evaluation(None, None, None, edited, _plan(out, manifest=manifest_fingerprint(edited)),
                           run_fn=_fake_rollout(calls))
        line = str(e.value)
        assert line.startswith(f"{out} holds an evaluation of other questions (the manifest's ids, texts or gold "
                               "answers changed: ") and "\n" not in line, line
    assert calls == [["q0", "q1", "q2", "q3"]]
    assert [r.answers for r in read_records(out / "records.jsonl")] == [["paris"]] * 8


def test_mopd_eval_run_with_an_edited_manifest_is_refused_and_a_larger_limit_continues(tiny_model_dir, qa_file,
                                                                                     tmp_path, capsys,
                                                                                     monkeypatch):
    monkeypatch.setenv("MOPD_CACHE", str(tmp_path / "cache"))
    index, out = small_index(tmp_path), tmp_path / "out"
    manifest = tmp_path / "test.jsonl"
    manifest.write_text(open(qa_file).read())

    def run(*extra):
        capsys.readouterr()
        rc = main(["eval", "run", "--model", tiny_model_dir, "--workflow", "cmas", "--manifest", str(manifest),
                   "--attempts", "1", "--out", str(out), *extra, f"retriever.index={index}",
                   "rollout.max_output_tokens=4"])
        return rc, capsys.readouterr()

    assert run("--limit", "2")[0] == 0
    rows = [json.loads(x) for x in manifest.read_text().splitlines()]
    rows[0]["question"] = "Where was band zero formed?"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rc, cap = run("--limit", "2")
    err = cap.err.strip()
    assert rc == 2 and "holds an evaluation of other questions" in err and "\n" not in err, err
    manifest.write_text(open(qa_file).read())
    rc, cap = run("--limit", "3")
    assert rc == 0 and "2 of 3 questions already finished; 1 to run" in cap.out, cap.out
    assert len(read_records(out / "records.jsonl")) == 3


def test_a_records_file_never_keeps_two_records_of_one_workflow(tmp_path):
    """What two writers made (every workflow twice, as 24 lines for 12): the continued run keeps one
    record of each, runs nothing again, and eval report reads the file."""
    out = tmp_path / "out"
    out.mkdir()
    once = [make_record(f"q{i}", "nq", a, right()) for i in range(6) for a in range(2)]
    write_records(out / "records.jsonl", once + [make_record(f"q{i}", "nq", a, right()) for i in range(6)
                                                for a in range(2)])
    kept, done = read_finished(out / "records.jsonl", 2)
    assert len(kept) == 12 and len(done) == 6 and len(read_records(out / "records.jsonl")) == 12
    calls = []
    run_evaluation(None, None, None, _questions(6), _plan(out), run_fn=_fake_rollout(calls))
    assert calls == []
    keys = [(r.question_id, r.attempt) for r in read_records(out / "records.jsonl")]
    assert len(keys) == len(set(keys)) == 12
    assert main(["eval", "report", str(out), "--out", str(tmp_path / "report"), "--no-plots", "--draws", "10"]) == 0


def test_eval_report_refuses_systems_whose_question_texts_differ(tmp_path, capsys):
    a = [make_record(f"q{i}", "nq", 0, right()) for i in range(3)]
    b = [make_record(f"q{i}", "nq", 0, right()) for i in range(3)]
    b[1].question = "an edited question?"
    with pytest.raises(EvalError) as e:
        align_runs({"A": a, "B": b})
    assert str(e.value) == ("question nq/q1 reads 'an edited question?' in system 'B' (attempt 0) but 'question q1?' "
                            "in system 'A' (attempt 0): the runs were made on different test files")
    for name, recs in (("A", a), ("B", b)):
        (tmp_path / name).mkdir()
        write_records(tmp_path / name / "records.jsonl", recs)
    capsys.readouterr()
    rc = main(["eval", "report", str(tmp_path / "A"), str(tmp_path / "B"), "--out", str(tmp_path / "r"), "--no-plots"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "reads 'an edited question?' in system 'B'" in err and "\n" not in err, err
