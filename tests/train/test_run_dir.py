"""A run directory refuses to mix two runs."""

import json
import shutil
from pathlib import Path

import pytest

from mopd.config import resolve
from mopd.train.run_dir import (
    RUN_FILE,
    RunDirError,
    default_out_dir,
    discard_unstarted,
    prepare_run_dir,
    run_identity,
    truncate_metrics,
)


def _cfg(model_dir, qa_file, out, preset="tiny_cmas_rl", **extra):
    o = {"model.path": model_dir, "data.train": qa_file, "trainer.out_dir": str(out), **extra}
    return resolve(preset, [f"{k}={v}" for k, v in o.items()])


def _hold_a_run(out):
    """What a trainer leaves behind: checkpoints and metrics."""
    (out / "checkpoints" / "step_000004").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')


def test_first_start_records_config_and_fingerprints(tiny_model_dir, qa_file, tmp_path):
    cfg = _cfg(tiny_model_dir, qa_file, tmp_path / "run")
    prepare_run_dir(cfg, resume=False)
    rec = json.loads((tmp_path / "run" / RUN_FILE).read_text())
    assert rec["config"]["method"] == cfg.method and rec["config"]["trainer.steps"] == cfg.trainer.steps
    assert rec["model"]["path"] == str(Path(tiny_model_dir).resolve())
    assert len(rec["model"]["weights"]) == 32 and rec["data"]["train"]["content"]


def test_fresh_start_refuses_a_directory_holding_a_run(tiny_model_dir, qa_file, tmp_path):
    out = tmp_path / "run"
    _hold_a_run(out)   # no run.json: an older run, or one whose run.json was lost
    with pytest.raises(RunDirError, match=r"already holds a run \(metrics.jsonl, checkpoints/\).*--resume.*--overwrite"):
        prepare_run_dir(_cfg(tiny_model_dir, qa_file, out), resume=False)
    assert (out / "checkpoints" / "step_000004").is_dir()


def test_overwrite_moves_the_old_run_aside(tiny_model_dir, qa_file, tmp_path):
    out = tmp_path / "run"
    _hold_a_run(out)
    (out / "notes.txt").write_text("mine")        # not a run file: stays
    start = prepare_run_dir(_cfg(tiny_model_dir, qa_file, out), resume=False, overwrite=True, now=0)
    assert start.moved_to.name.startswith("run.replaced-") and start.moved_to.parent == tmp_path
    assert (start.moved_to / "checkpoints" / "step_000004").is_dir()
    assert (start.moved_to / "metrics.jsonl").read_text().count("step") == 2
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", RUN_FILE]
    again = prepare_run_dir(_cfg(tiny_model_dir, qa_file, out), resume=False, overwrite=True, now=0)
    assert again.moved_to != start.moved_to and again.moved_to.is_dir()   # same second: a new name
    assert "moved to" in again.events[0]


def test_resume_with_another_preset_or_override_lists_the_differences(tiny_model_dir, qa_file, tmp_path):
    out = tmp_path / "run"
    prepare_run_dir(_cfg(tiny_model_dir, qa_file, out), resume=False)
    prepare_run_dir(_cfg(tiny_model_dir, qa_file, out), resume=True)     # the same run: fine
    with pytest.raises(RunDirError, match=r"--resume would change the run in \S+: method: tiny_cmas_rl -> tiny_outcome_searcher; teacher.path"):
        prepare_run_dir(_cfg(tiny_model_dir, qa_file, out, preset="tiny_outcome_searcher",
                             **{"teacher.path": tiny_model_dir}), resume=True)
    with pytest.raises(RunDirError, match=r"trainer.steps: \d+ -> 999"):
        prepare_run_dir(_cfg(tiny_model_dir, qa_file, out, **{"trainer.steps": 999}), resume=True)
    assert json.loads((out / RUN_FILE).read_text())["changes"] == []   # a refused resume records nothing


def test_allow_changed_accepts_and_records_a_deliberate_change(tiny_model_dir, qa_file, tmp_path):
    out = tmp_path / "run"
    prepare_run_dir(_cfg(tiny_model_dir, qa_file, out), resume=False)
    start = prepare_run_dir(_cfg(tiny_model_dir, qa_file, out, **{"trainer.steps": 999, "trainer.lr": 0.5}),
                            resume=True, allow_changed=["trainer.steps", "trainer.lr"])
    assert set(start.changes) == {"trainer.steps", "trainer.lr"} and "--allow-changed" in start.events[0]
    rec = json.loads((out / RUN_FILE).read_text())
    assert rec["config"]["trainer.steps"] == 999 and rec["changes"][0]["changed"]["trainer.steps"][1] == 999
    with pytest.raises(RunDirError, match="trainer.lr"):   # allowing a section covers its keys only
        prepare_run_dir(_cfg(tiny_model_dir, qa_file, out, **{"trainer.steps": 999, "trainer.lr": 0.1}),
                        resume=True, allow_changed=["rollout"])
    prepare_run_dir(_cfg(tiny_model_dir, qa_file, out, **{"trainer.steps": 5, "trainer.lr": 0.1}),
                    resume=True, allow_changed=["trainer"])


def test_resume_with_a_same_named_model_elsewhere_or_rewritten_weights_is_refused(tiny_model_dir, qa_file, tmp_path):
    a = tmp_path / "a" / "export"
    b = tmp_path / "b" / "export"
    shutil.copytree(tiny_model_dir, a)
    shutil.copytree(tiny_model_dir, b)
    out = tmp_path / "run"
    prepare_run_dir(_cfg(str(a), qa_file, out), resume=False)
    with pytest.raises(RunDirError, match="model.resolved_path"):
        prepare_run_dir(_cfg(str(b), qa_file, out), resume=True)
    weights = min(a.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-8:] = bytes(8 - i for i in range(8))                           # same size, other weights
    weights.write_bytes(bytes(data))
    with pytest.raises(RunDirError, match=r"model.weights: \w+ -> \w+") as e:
        prepare_run_dir(_cfg(str(a), qa_file, out), resume=True)
    assert "model.resolved_path" not in str(e.value)


def test_resume_with_other_training_data_is_refused(tiny_model_dir, qa_file, tmp_path):
    out = tmp_path / "run"
    data = tmp_path / "train.jsonl"
    shutil.copy(qa_file, data)
    prepare_run_dir(_cfg(tiny_model_dir, str(data), out), resume=False)
    data.write_text(data.read_text().replace("town 1", "town 7"))
    with pytest.raises(RunDirError, match="data.train.content"):
        prepare_run_dir(_cfg(tiny_model_dir, str(data), out), resume=True)


def test_resume_of_a_run_without_run_json_compares_its_config_yaml(tiny_model_dir, qa_file, tmp_path):
    from mopd.config import to_yaml

    out = tmp_path / "run"
    _hold_a_run(out)
    (out / "config.yaml").write_text(to_yaml(_cfg(tiny_model_dir, qa_file, out)))
    with pytest.raises(RunDirError, match="method"):
        prepare_run_dir(_cfg(tiny_model_dir, qa_file, out, preset="tiny_outcome_searcher",
                             **{"teacher.path": tiny_model_dir}), resume=True)
    start = prepare_run_dir(_cfg(tiny_model_dir, qa_file, out), resume=True)
    assert "config.yaml" in start.events[-1] and (out / RUN_FILE).is_file()


def test_resume_and_overwrite_together_are_refused(tiny_model_dir, qa_file, tmp_path):
    with pytest.raises(RunDirError, match="choose one"):
        prepare_run_dir(_cfg(tiny_model_dir, qa_file, tmp_path), resume=True, overwrite=True)


def test_identity_ignores_logging_keys(tiny_model_dir, qa_file, tmp_path):
    out = tmp_path / "run"
    prepare_run_dir(_cfg(tiny_model_dir, qa_file, out), resume=False)
    prepare_run_dir(_cfg(tiny_model_dir, qa_file, out, **{"trainer.log_every": 7}), resume=True)
    assert run_identity(_cfg(tiny_model_dir, qa_file, out))["teacher"] is None


def test_default_out_dir_carries_the_preset_name(tiny_model_dir, qa_file):
    cfg = resolve("tiny_cmas_rl", [])
    assert cfg.trainer.out_dir == "runs/default" and default_out_dir(cfg, "tiny_cmas_rl")
    assert cfg.trainer.out_dir == "runs/tiny_cmas_rl"
    mine = resolve("tiny_cmas_rl", ["trainer.out_dir=runs/x"])
    assert not default_out_dir(mine, "tiny_cmas_rl") and mine.trainer.out_dir == "runs/x"


def test_truncate_metrics_drops_later_steps_and_everything_without_a_checkpoint(tmp_path):
    f = tmp_path / "metrics.jsonl"
    f.write_text("".join(json.dumps({"step": s, "x": s}) + "\n" for s in (0, 1, 2, 3)) + '{"step": 4, "x"')
    assert truncate_metrics(f, 2) == 2 and [json.loads(x)["step"] for x in f.read_text().splitlines()] == [0, 1, 2]
    assert truncate_metrics(f, None) == 3 and f.read_text() == ""
    assert truncate_metrics(tmp_path / "none.jsonl", 3) == 0


def test_a_fresh_start_that_failed_before_training_frees_the_directory(tiny_model_dir, qa_file, tmp_path):
    out = tmp_path / "run"
    prepare_run_dir(_cfg(tiny_model_dir, qa_file, out), resume=False)
    (out / "config.yaml").write_text("x: 1\n")
    (out / "events.jsonl").write_text('{"kind": "data"}\n')
    (out / "notes.txt").write_text("mine")
    assert discard_unstarted(out) and sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    prepare_run_dir(_cfg(tiny_model_dir, qa_file, out), resume=False)      # not refused now
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    assert not discard_unstarted(out) and (out / RUN_FILE).is_file()     # it trained: kept


def _bm25_index(root, n=12, town=3):
    from mopd.retriever import IndexSpec, build_index

    corpus = root / "corpus.jsonl"
    corpus.parent.mkdir(parents=True, exist_ok=True)
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f"Band {i}\nBand {i} formed in town {i % town}."})
                              + "\n" for i in range(n)))
    return build_index(corpus, root / "index", IndexSpec(index_kind="bm25"), overwrite=True)


def test_run_json_records_the_retriever_and_the_engine(tiny_model_dir, qa_file, tmp_path):
    from mopd.retriever import index_fingerprint

    index = _bm25_index(tmp_path / "a")
    out = tmp_path / "run"
    prepare_run_dir(_cfg(tiny_model_dir, qa_file, out, **{"retriever.index": str(index)}), resume=False)
    rec = json.loads((out / RUN_FILE).read_text())
    assert rec["retriever"] == {"kind": "inprocess", "index": str(index.resolve()),
                                "fingerprint": index_fingerprint(index)}
    assert rec["config"]["rollout.engine"] == "hf" and rec["config"]["retriever.index"] == str(index)
    bundled = run_identity(_cfg(tiny_model_dir, qa_file, out))["retriever"]
    assert bundled["index"] == "bundled" and bundled["fingerprint"] not in (None, rec["retriever"]["fingerprint"])


def test_resume_with_another_retriever_or_a_rebuilt_index_is_refused(tiny_model_dir, qa_file, tmp_path):
    index = _bm25_index(tmp_path / "a")
    other = _bm25_index(tmp_path / "b", n=13)
    out = tmp_path / "run"
    prepare_run_dir(_cfg(tiny_model_dir, qa_file, out, **{"retriever.index": str(index)}), resume=False)
    prepare_run_dir(_cfg(tiny_model_dir, qa_file, out, **{"retriever.index": str(index)}), resume=True)
    with pytest.raises(RunDirError, match=r"retriever.fingerprint: \w+ -> \w+; retriever.index"):
        prepare_run_dir(_cfg(tiny_model_dir, qa_file, out, **{"retriever.index": str(other)}), resume=True)
    with pytest.raises(RunDirError, match="retriever.index: .* -> bundled"):
        prepare_run_dir(_cfg(tiny_model_dir, qa_file, out), resume=True)
    with pytest.raises(RunDirError, match="rollout.engine: hf -> vllm"):
        prepare_run_dir(_cfg(tiny_model_dir, qa_file, out, **{"retriever.index": str(index),
                                                              "rollout.engine": "vllm",
                                                              "trainer.old_logprobs": "recompute"}), resume=True)
    _bm25_index(tmp_path / "a", town=5)                     # the same directory, rebuilt from another corpus
    with pytest.raises(RunDirError, match="retriever.fingerprint") as e:
        prepare_run_dir(_cfg(tiny_model_dir, qa_file, out, **{"retriever.index": str(index)}), resume=True)
    assert "retriever.index" not in str(e.value) and "\n" not in str(e.value)


def test_a_run_recorded_before_the_retriever_was_resumes_on_its_config(tiny_model_dir, qa_file, tmp_path):
    out = tmp_path / "run"
    prepare_run_dir(_cfg(tiny_model_dir, qa_file, out), resume=False)
    rec = json.loads((out / RUN_FILE).read_text())
    del rec["retriever"]
    (out / RUN_FILE).write_text(json.dumps(rec))
    prepare_run_dir(_cfg(tiny_model_dir, qa_file, out), resume=True)
    assert "retriever" in json.loads((out / RUN_FILE).read_text())
    with pytest.raises(RunDirError, match="retriever.index"):       # its config is still compared
        prepare_run_dir(_cfg(tiny_model_dir, qa_file, out, **{"retriever.index": str(tmp_path)}), resume=True)


def test_the_kl_estimator_is_compared_on_resume_only_when_it_is_not_k1(tiny_model_dir, qa_file, tmp_path):
    """A run recorded before reward.kl_type existed (no such key: k1) resumes under the default; a
    resume that picks another estimator is a change."""
    out = tmp_path / "run"
    prepare_run_dir(_cfg(tiny_model_dir, qa_file, out), resume=False)
    _hold_a_run(out)
    rec = json.loads((out / RUN_FILE).read_text())
    rec["config"].pop("reward.kl_type", None)   # as a run from before the setting wrote it
    (out / RUN_FILE).write_text(json.dumps(rec))
    with pytest.raises(RunDirError, match="reward.kl_type"):
        prepare_run_dir(_cfg(tiny_model_dir, qa_file, out, **{"reward.kl_type": "k2"}), resume=True)
    prepare_run_dir(_cfg(tiny_model_dir, qa_file, out, **{"reward.kl_type": "k1"}), resume=True)
