"""One writer per pipeline root and per run: a second `mopd pipeline` on a root in use is
refused in one line naming the holder, and a pipeline's in-process training stage holds its run
directory's lock as `mopd train` does (two pipelines trained Stage I twice into one directory)."""

import os

from mopd.core.run_lock import RunLock
from mopd.pipeline.presets import pipeline_yaml
from mopd.pipeline.stages import TrainStage, plan
from tests.helpers.cli import one_line_error
from tests.pipeline.conftest import tiny_pipeline


def _yaml(cfg, tmp_path):
    f = tmp_path / "pipeline.yaml"
    f.write_text(pipeline_yaml(cfg))
    return str(f)


def test_a_second_pipeline_on_a_root_in_use_is_refused_naming_the_holder(tiny_model_dir, qa_file, tmp_path, capsys):
    cfg = tiny_pipeline(tiny_model_dir, qa_file, tmp_path / "root")
    f = _yaml(cfg, tmp_path)
    with RunLock(cfg.root, "mopd pipeline tiny"):
        one_line_error(capsys, ["pipeline", "--file", f], f"in use by pid {os.getpid()} (mopd pipeline tiny)",
                       "one pipeline runs in a root")
    assert sorted(p.name for p in (tmp_path / "root").iterdir()) == [".mopd.lock"]


def test_a_training_stage_holds_its_run_directory(tiny_model_dir, qa_file, tmp_path, capsys):
    cfg = tiny_pipeline(tiny_model_dir, qa_file, tmp_path / "root")
    stage1 = next(s for s in plan(cfg) if isinstance(s, TrainStage))
    f = _yaml(cfg, tmp_path)
    with RunLock(stage1.run_dir, "mopd train --resume"):     # e.g. the user resuming Stage I by hand
        one_line_error(capsys, ["pipeline", "--file", f], str(stage1.run_dir),
                       f"in use by pid {os.getpid()} (mopd train --resume)", progress=True)
    assert not (stage1.run_dir / "metrics.jsonl").exists() and not (stage1.run_dir / "run.json").exists()
    with RunLock(cfg.root, "mopd pipeline tiny"):             # the pipeline let go of its root on the way out
        pass
