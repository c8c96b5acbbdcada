"""Tuned on dev only: nothing in the demo reads the test split between building the world and the
final evaluation, and a dev-split run (the tuning path) never reads it at all."""

import json
import sys

import pytest

import mopd.recipes.tiny_world.world as tinyworld
import mopd.pipeline.run as pipeline_run
from mopd.recipes.tiny_world.demo import run_demo
from mopd.recipes.tiny_world.pipeline import DemoSettings
from tests.helpers.stamps import stamps

_LOG: list = []
_ACTIVE = [False]


def _hook(event, args):
    if not _ACTIVE[0] or event != "open" or not args:
        return
    path, mode = args[0], args[1] if len(args) > 1 else None
    if isinstance(path, (str, bytes)) or hasattr(path, "__fspath__"):
        p = str(path if not isinstance(path, bytes) else path.decode())
        reading = mode is None or (isinstance(mode, str) and "r" in mode and "+" not in mode)
        if reading and (p.endswith("questions/test.jsonl") or p.endswith("pools/test.jsonl")):
            _LOG.append(("read-test", p))


sys.addaudithook(_hook)


@pytest.fixture
def phases(monkeypatch):
    """_LOG gets ('world-done',) after the world is built and ('eval',) when the final evaluation
    starts (before it reads its questions)."""
    build, questions = tinyworld.build_world, pipeline_run.eval_questions

    def build_world(*a, **k):
        out = build(*a, **k)
        _LOG.append(("world-done",))
        return out

    def _eval_questions(*a, **k):
        _LOG.append(("eval",))
        return questions(*a, **k)

    monkeypatch.setattr(tinyworld, "build_world", build_world)
    monkeypatch.setattr(pipeline_run, "eval_questions", _eval_questions)
    _LOG.clear()
    _ACTIVE[0] = True
    yield _LOG
    _ACTIVE[0] = False


def _between_world_and_eval(log):
    start = log.index(("world-done",))
    ends = [i for i, e in enumerate(log) if e[0] == "eval"]
    return log[start:ends[0] if ends else len(log)]


@pytest.mark.slow
def test_no_test_split_read_before_the_final_evaluation(tmp_path, phases):
    s = DemoSettings(out=str(tmp_path / "d"), quick=True, stage1_steps=1, stage2_steps=1, test_questions=2,
                     attempts=1, bootstrap_draws=20, pi0_check_attempts=1, eval_split="dev")
    report = run_demo(s)
    # the tuning path: dev only, from start to end
    assert report == tmp_path / "d" / "report_dev" / "report.md"
    assert not [e for e in _between_world_and_eval(phases) if e[0] == "read-test"]
    assert not [e for e in phases[phases.index(("world-done",)):] if e[0] == "read-test"]
    assert (tmp_path / "d" / "eval_dev").is_dir() and not (tmp_path / "d" / "eval").exists()
    assert "dev split" in report.read_text()
    check = json.loads((tmp_path / "d" / "report_dev" / "pi0_check.json").read_text())
    assert check["split"] == "dev" and check["weak"] in (True, False) and "Warm start" in report.read_text()
    # the final evaluation on test reuses every stage; the test split is read only once it starts
    built = stamps(tmp_path / "d")
    phases.clear()
    s.eval_split = "test"
    run_demo(s)
    assert stamps(tmp_path / "d") == built               # every stage reused: none rewrote its files
    before = _between_world_and_eval(phases)
    assert not [e for e in before if e[0] == "read-test"]
    assert [e for e in phases if e[0] == "read-test"], "the final evaluation reads the test split"
    t = json.loads((tmp_path / "d" / "timings.json").read_text())
    last = t["last_run"]                                  # this run's own stage times
    assert t["stage1"] >= last["stage1"] and t["total"] >= last["total"]   # the building run's times stay
