"""An evaluation run refuses to continue with another model of the same directory name."""

import shutil

import pytest

from mopd.config import Config
from mopd.core.fingerprint import model_fingerprint
from mopd.core.qa import QAExample, write_questions
from mopd.eval.alignment import EvalError
from mopd.eval.runner import EvalPlan, run_evaluation
from mopd.rollout.run_state import WorkflowSettings
from tests.helpers.eval_records import make_record, right


def _fake_rollout(engine, retriever, tokenizer, questions, settings, *, attempts, method="", progress=True):
    return [make_record(q.id, q.dataset, a, right(), workflow=settings.workflow)
            for q in questions for a in range(attempts)]


def _model_dir(path, weights: bytes):
    path.mkdir(parents=True)
    (path / "config.json").write_text('{"model_type": "qwen3"}')
    (path / "model.safetensors").write_bytes(weights)
    return path


def _plan(out, model_dir):
    return EvalPlan(out, WorkflowSettings.for_evaluation(Config(), "cmas"), attempts=2, method="export",
                    model=model_fingerprint(model_dir))


def _questions(n):
    return [QAExample(id=f"q{i}", dataset="nq", question=f"Q{i}?", answers=["Paris"]) for i in range(n)]


def test_same_named_model_elsewhere_or_rewritten_is_refused(tmp_path):
    a = _model_dir(tmp_path / "a" / "export", b"\x01" * 1000)
    b = _model_dir(tmp_path / "b" / "export", b"\x02" * 1000)
    out = tmp_path / "run"
    run_evaluation(None, None, None, _questions(2), _plan(out, a), run_fn=_fake_rollout)
    run_evaluation(None, None, None, _questions(3), _plan(out, a), run_fn=_fake_rollout)   # same model: resumes
    with pytest.raises(EvalError, match="model_path"):
        run_evaluation(None, None, None, _questions(3), _plan(out, b), run_fn=_fake_rollout)
    (a / "model.safetensors").write_bytes(b"\x03" * 1000)                                   # same size, new weights
    with pytest.raises(EvalError, match="model_weights") as e:
        run_evaluation(None, None, None, _questions(3), _plan(out, a), run_fn=_fake_rollout)
    assert "model_path" not in str(e.value)


def test_another_retriever_index_or_engine_is_refused_as_a_changed_setting(tmp_path):
    import json

    from mopd.eval.runner import check_continuation

    a = _model_dir(tmp_path / "m", b"\x01" * 1000)
    out = tmp_path / "run"
    first = {"kind": "inprocess", "index": "/idx/wiki", "fingerprint": "f" * 32}

    def plan(retriever=first, engine="vllm"):
        return EvalPlan(out, WorkflowSettings.for_evaluation(Config(), "cmas"), attempts=2, method="export",
                        model=model_fingerprint(a), retriever=retriever, engine=engine)

    run_evaluation(None, None, None, _questions(2), plan(), run_fn=_fake_rollout)
    settings = json.loads((out / "run.json").read_text())["settings"]
    assert settings["retriever_kind"] == "inprocess" and settings["retriever_index"] == "/idx/wiki"
    assert settings["retriever_fingerprint"] == "f" * 32 and settings["engine"] == "vllm"
    run_evaluation(None, None, None, _questions(3), plan(), run_fn=_fake_rollout)     # the same: continues
    for other, key in ((dict(first, fingerprint="e" * 32), "retriever_fingerprint"),   # the index rebuilt
                       (dict(first, index="/idx/bundled"), "retriever_index"),
                       ({"kind": "http", "url": "http://h:8000", "fingerprint": "f" * 32}, "retriever_kind")):
        with pytest.raises(EvalError, match=key) as e:
            check_continuation(plan(retriever=other))
        assert "\n" not in str(e.value)
        with pytest.raises(EvalError, match=key):
            run_evaluation(None, None, None, _questions(3), plan(retriever=other), run_fn=_fake_rollout)
    with pytest.raises(EvalError, match="'engine': \\('vllm', 'hf'\\)"):
        check_continuation(plan(engine="hf"))


def test_an_evaluation_recorded_before_the_retriever_was_continues(tmp_path):
    import json

    a = _model_dir(tmp_path / "m", b"\x01" * 1000)
    out = tmp_path / "run"
    run_evaluation(None, None, None, _questions(2), _plan(out, a), run_fn=_fake_rollout)   # no retriever, engine
    ident = {"kind": "inprocess", "index": "/idx", "fingerprint": "f" * 32}
    again = EvalPlan(out, WorkflowSettings.for_evaluation(Config(), "cmas"), attempts=2, method="export",
                     model=model_fingerprint(a), retriever=ident, engine="hf")
    run_evaluation(None, None, None, _questions(3), again, run_fn=_fake_rollout)
    assert json.loads((out / "run.json").read_text())["settings"]["retriever_index"] == "/idx"


def test_fingerprint_reads_samples_of_large_files_and_ignores_other_files(tmp_path):
    big = bytearray(b"\x00" * (9 << 20))
    a = _model_dir(tmp_path / "a", bytes(big))
    first = model_fingerprint(a)
    (a / "README.md").write_text("notes")                    # not a weight file: same model
    assert model_fingerprint(a) == first
    big[5 << 20] = 1                                         # inside a sampled block? no: between samples
    big[0] = 1                                               # the header block is always sampled
    (a / "model.safetensors").write_bytes(bytes(big))
    assert model_fingerprint(a)["weights"] != first["weights"]
    assert model_fingerprint("Qwen/Qwen3-4B") == {"path": "Qwen/Qwen3-4B", "weights": None}


@pytest.mark.slow
def test_eval_run_cli_refuses_another_export_in_the_same_out(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    import mopd.retriever
    from mopd.cli import main
    from tests.helpers.tiny_model import init_tiny_model

    class _Retriever:
        def search(self, queries, k):
            return [[] for _ in queries]

    monkeypatch.setattr(mopd.retriever, "load_retriever", lambda cfg: _Retriever())
    a = init_tiny_model(tmp_path / "a" / "export", hidden=32, layers=1, heads=2, ffn=64, max_positions=4096, seed=0)
    b = tmp_path / "b" / "export"
    shutil.copytree(a, b)
    init_tiny_model(b, hidden=32, layers=1, heads=2, ffn=64, max_positions=4096, seed=1)   # other weights
    manifest = tmp_path / "test.jsonl"
    write_questions(manifest, [QAExample("q0", "nq", "Where was band 0 formed?", ["Paris"])])
    out = tmp_path / "run"

    def run(model):
        return main(["eval", "run", "--model", str(model), "--workflow", "cmas", "--manifest", str(manifest),
                     "--attempts", "1", "--out", str(out), "rollout.max_output_tokens=4", "rollout.max_steps=2",
                     "retriever.index=bundled"])

    assert run(a) == 0
    capsys.readouterr()
    assert run(b) == 2
    err = capsys.readouterr().err
    assert "model_path" in err and "Traceback" not in err
