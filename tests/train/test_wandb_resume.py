"""The W&B run's id is kept in run.json, so that a resume continues the same W&B run (W&B's offline
mode: nothing leaves the machine). wandb is not among the dev extras: without it the W&B tests
skip, saying so; the run.json bookkeeping is tested either way."""

import json

import pytest

from mopd.config import resolve
from mopd.train.run_dir import prepare_run_dir, record_wandb_run, wandb_run


def _cfg(tmp_path):
    out = tmp_path / "run"
    return resolve("tiny_cmas_rl", [f"trainer.out_dir={out}", "retriever.index=bundled"]), out


def test_resume_keeps_the_wandb_run_and_a_fresh_start_drops_it(tmp_path):
    cfg, out = _cfg(tmp_path)
    prepare_run_dir(cfg, resume=False)
    assert wandb_run(out) is None
    assert record_wandb_run(out, "abc123", "proj")
    assert wandb_run(out) == {"id": "abc123", "project": "proj"}
    prepare_run_dir(cfg, resume=True)                       # run.json rewritten: the W&B run is kept
    assert wandb_run(out) == {"id": "abc123", "project": "proj"}
    assert json.loads((out / "run.json").read_text())["config"]["trainer.out_dir"] == str(out)
    prepare_run_dir(cfg, resume=False, overwrite=True)      # another run: another W&B run
    assert wandb_run(out) is None
    assert not record_wandb_run(tmp_path / "nothing", "x", "p")   # no run.json: nowhere to keep it


def test_a_resumed_logger_continues_the_same_wandb_run_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is not installed (pip install wandb to run this test)")
    from mopd.train.metrics_log import MetricsLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    cfg, out = _cfg(tmp_path)
    prepare_run_dir(cfg, resume=False)
    first = MetricsLogger(out, wandb_project="mopd-test", config={"a": 1})
    run_id = first._wandb.id
    first.log(1, {"loss": 0.5})
    first.close()
    assert wandb_run(out) == {"id": run_id, "project": "mopd-test"} and not first.wandb_resumed
    prepare_run_dir(cfg, resume=True)                       # what `mopd train --resume` does first
    second = MetricsLogger(out, wandb_project="mopd-test", config={"a": 1})
    assert second.wandb_resumed and second._wandb.id == run_id
    second.log(2, {"loss": 0.4})
    second.close()
    offline = sorted(p.name for p in (out / "wandb").glob("offline-run-*"))
    assert len(offline) == 2 and all(name.endswith(run_id) for name in offline)   # one W&B run, two sessions
    # Another project is another W&B run, recorded in its place.
    third = MetricsLogger(out, wandb_project="elsewhere")
    assert not third.wandb_resumed and third._wandb.id != run_id
    third.close()
    assert wandb_run(out) == {"id": third._wandb.id, "project": "elsewhere"}
