"""`mopd eval run` end to end on a random tiny Qwen3 model: the real engine and scheduler, a fake
retriever, then `mopd eval report` on the result. Checks the plumbing, not accuracy."""

import json

import pytest

from mopd.cli import main
from mopd.core.qa import QAExample, write_questions
from mopd.core.records import read_records


class _Passage:
    def __init__(self, i, q):
        self.id, self.title, self.text, self.score = f"{q}#{i}", f"T{i}", f"passage {i} about {q}", 0.0


class _Retriever:
    def search(self, queries, k):
        return [[_Passage(i, q) for i in range(k)] for q in queries]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    pytest.importorskip("transformers")
    from tests.helpers.tiny_model import init_tiny_model

    return init_tiny_model(tmp_path_factory.mktemp("tiny") / "model", hidden=32, layers=1, heads=2, ffn=64,
                           max_positions=4096)


@pytest.mark.slow
def test_eval_run_then_report(tiny_model, tmp_path, monkeypatch, capsys):
    import mopd.retriever

    monkeypatch.setattr(mopd.retriever, "load_retriever", lambda cfg: _Retriever())
    manifest = tmp_path / "test.jsonl"
    write_questions(manifest, [QAExample(f"q{i}", "nq" if i % 2 else "hq", f"Where was band {i} formed?", ["Paris"])
                               for i in range(3)])
    out = tmp_path / "run"
    args = ["eval", "run", "--model", str(tiny_model), "--workflow", "cmas", "--manifest", str(manifest),
            "--attempts", "2", "--out", str(out), "--chunk", "2",
            "rollout.max_output_tokens=12", "rollout.max_steps=2", "retriever.index=bundled"]
    assert main(args) == 0
    recs = read_records(out / "records.jsonl")
    assert sorted((r.question_id, r.attempt) for r in recs) == [(f"q{i}", a) for i in range(3) for a in range(2)]
    assert {r.method for r in recs} == {"model"} and {r.workflow for r in recs} == {"cmas"}
    segments = [s for r in recs for c in r.calls for s in c.segments]
    assert segments and all(s.token_ids == [] and s.logprobs is None for s in segments)  # texts only
    assert any(s.text for s in segments) and all(r.output_tokens > 0 for r in recs)
    run = json.loads((out / "run.json").read_text())
    assert run["settings"]["temperature"] == 0.6 and run["settings"]["max_output_tokens"] == 12
    assert run["finished_questions"] == 3
    assert run["settings"]["engine"] == "hf" and run["settings"]["retriever_index"] == "bundled"   # as asked, on a CPU
    # Started again: nothing left to run, records unchanged.
    before = (out / "records.jsonl").read_bytes()
    assert main(args) == 0
    assert (out / "records.jsonl").read_bytes() == before
    assert "3 of 3 questions already finished" in capsys.readouterr().out
    assert main(["eval", "report", str(out), "--out", str(tmp_path / "rep"), "--draws", "100",
                 "--no-plots"]) == 0
    m = json.loads((tmp_path / "rep" / "metrics.json").read_text())
    assert m["protocol"]["attempts"] == 2 and set(m["datasets"]) == {"hq", "nq"}
