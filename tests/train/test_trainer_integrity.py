"""The trainer keeps a run whole: SIGTERM saves, a resume without a checkpoint
starts metrics afresh, and the best-validation checkpoint is kept beside the last K."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from mopd.config import resolve
from mopd.train import checkpoint as ckpt
from mopd.train.trainer import PolicyTrainer
from tests.helpers.retrievers import FakeRetriever
from tests.helpers.training import tiny_overrides


def _trainer(model_dir, qa_file, out, resume=False, **extra):
    cfg = resolve("cmas_rl", tiny_overrides(model_dir, qa_file, out, **extra))
    return PolicyTrainer(cfg, retriever=FakeRetriever(), resume=resume, progress=False)


def _events(out):
    return [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]


def test_best_validation_checkpoint_is_kept_beside_the_last_k(tiny_model_dir, qa_file, tmp_path):
    out = tmp_path / "run"
    t = _trainer(tiny_model_dir, qa_file, out, **{"trainer.val_every": 1, "trainer.checkpoint_every": 2,
                                                  "trainer.keep_checkpoints": 1, "trainer.steps": 4,
                                                  "trainer.questions_per_step": 1,
                                                  "rollout.max_output_tokens": 6})
    scores = [0.1, 0.3, 0.2, 0.05]
    t.validate = lambda: {"val/em": scores.pop(0)}
    t.fit(4)
    assert [p.name for p in ckpt.list_checkpoints(out)] == ["step_000002", "step_000004"]
    assert ckpt.read_best(out) == {"step": 2, "metric": "val/em", "value": 0.3}
    best = [e for e in _events(out) if e["kind"] == "checkpoint_best"]
    assert [e["step"] for e in best] == [1, 2] and "kept beside the last 1" in best[-1]["message"]
    saves = [e["step"] for e in _events(out) if e["kind"] == "checkpoint"]
    assert saves == [1, 2, 4]                             # a best step already saved is not saved twice
    assert ckpt.select_checkpoint(out, "best")[0].name == "step_000002"


def test_resume_without_a_checkpoint_starts_metrics_afresh(tiny_model_dir, qa_file, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 0, "val/em": 0.1}\n{"step": 1, "x": 1}\n')  # killed before a save
    t = _trainer(tiny_model_dir, qa_file, out, resume=True, **{"trainer.questions_per_step": 1})
    assert t.step == 0 and (out / "metrics.jsonl").read_text() == ""
    t.fit(2)
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_resume_falls_back_past_a_damaged_checkpoint_and_says_why(tiny_model_dir, qa_file, tmp_path):
    out = tmp_path / "run"
    extra = {"trainer.checkpoint_every": 1, "trainer.keep_checkpoints": 3, "trainer.questions_per_step": 1}
    _trainer(tiny_model_dir, qa_file, out, **extra).fit(2)
    shard = min((out / "checkpoints" / "step_000002").glob("*.distcp"))
    with shard.open("r+b") as f:
        f.truncate(shard.stat().st_size - 10)
    t = _trainer(tiny_model_dir, qa_file, out, resume=True, **extra)
    assert t.step == 1
    skipped = [e for e in _events(out) if e["kind"] == "checkpoint_skipped"]
    assert len(skipped) == 1 and "step_000002" in skipped[0]["message"] and "truncated" in skipped[0]["message"]


def _small_index(tmp_path):
    from mopd.retriever import build_index
    from mopd.retriever.builder import IndexSpec

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f"Band {i}\nBand {i} was formed in town {i % 3}."})
                              + "\n" for i in range(12)))
    return build_index(corpus, tmp_path / "index", IndexSpec(index_kind="bm25"))


@pytest.mark.slow
def test_sigterm_to_mopd_train_writes_a_verified_checkpoint(tiny_model_dir, qa_file, tmp_path):
    out = tmp_path / "run"
    overrides = tiny_overrides(tiny_model_dir, qa_file, out, **{
        "trainer.steps": 100000, "trainer.log_every": 1, "trainer.questions_per_step": 1,
        "retriever.index": str(_small_index(tmp_path))})
    env = dict(os.environ, PYTHONPATH=os.getcwd(), MOPD_CACHE=str(tmp_path / "cache"))
    proc = subprocess.Popen([sys.executable, "-m", "mopd", "train", "cmas_rl", *overrides],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.is_file() and metrics.read_text().strip()) and proc.poll() is None:
        assert time.monotonic() < deadline, "training did not start"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err
    path, skipped = ckpt.find_checkpoint(out)
    assert path is not None and not skipped
    kinds = [e["kind"] for e in _events(out)]
    assert "interrupt" in kinds and kinds.index("interrupt") < len(kinds) - 1   # the save came after it


def test_validation_runs_val_attempts_workflows_per_dev_question(tiny_model_dir, qa_file, tmp_path):
    t = _trainer(tiny_model_dir, qa_file, tmp_path / "run", **{"data.dev": qa_file, "data.dev_size": 3,
                                                              "trainer.val_attempts": 3,
                                                              "rollout.max_output_tokens": 6})
    seen = []
    inner = t.rollout_fn

    def recording(engine, retriever, tokenizer, questions, settings, attempts, **kw):
        records = inner(engine, retriever, tokenizer, questions, settings, attempts=attempts, **kw)
        seen.append((len(questions), attempts, len(records)))
        return records

    t.rollout_fn = recording
    m = t.validate()
    assert seen == [(3, 3, 9)]
    assert 0.0 <= m["val/em"] <= 1.0 and m["val/em"] * 9 == pytest.approx(round(m["val/em"] * 9))
    with pytest.raises(ValueError, match="val_attempts"):
        resolve("cmas_rl", tiny_overrides(tiny_model_dir, qa_file, tmp_path / "x", **{"trainer.val_attempts": 0}))


def test_resuming_a_run_past_its_new_step_target_is_refused(tiny_model_dir, qa_file, tmp_path):
    """A run trained to step 3 and resumed with trainer.steps=2 would export step 3's weights as
    the 2-step run's (the demo did, when its Stage II steps were cut): refused in one line."""
    from mopd.train.trainer import TrainingError

    out = tmp_path / "run"
    kw = {"trainer.questions_per_step": 1, "rollout.max_output_tokens": 6, "trainer.val_every": 0}
    t = _trainer(tiny_model_dir, qa_file, out, **kw, **{"trainer.steps": 3})
    t.fit()
    t.close()
    t = _trainer(tiny_model_dir, qa_file, out, resume=True, **kw, **{"trainer.steps": 2})
    try:
        with pytest.raises(TrainingError, match=r"at step 3, past trainer.steps=2"):
            t.fit()
    finally:
        t.close()
