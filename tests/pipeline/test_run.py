"""The tiny pipeline end to end on the CPU: from a YAML file through `mopd pipeline`, reused on a
second run, resumed after a stage was interrupted, and with the subprocess launcher (each stage
its `mopd ...` command, as on GPUs)."""

import json
from pathlib import Path

import pytest

from mopd.cli import main
from mopd.pipeline.presets import pipeline_yaml
from mopd.pipeline.run import run_pipeline
from tests.pipeline.conftest import tiny_pipeline

SYSTEMS = ["c_mas_base", "c_mas_plus_rl", "multiagent_opd"]
BUILT = ["stage1/DONE", "stage1/metrics.jsonl", "stage1/export/model.safetensors", "stage2/DONE",
         "stage2/metrics.jsonl", "stage2/export/model.safetensors", "report/report.md", "report/metrics.json"] + \
        [f"eval/{s}/records.jsonl" for s in SYSTEMS]
"""What the stages write: a reused stage leaves its files untouched."""


def _stamps(root):
    return {rel: ((root / rel).stat().st_mtime_ns, (root / rel).stat().st_size) for rel in BUILT}


def _steps(run_dir):
    return [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _check_outputs(root, stage2_steps=2, stage1_steps=2):
    assert _steps(root / "stage1") == list(range(stage1_steps + 1))
    assert _steps(root / "stage2") == list(range(stage2_steps + 1))
    for s in SYSTEMS:
        assert len((root / "eval" / s / "records.jsonl").read_text().splitlines()) == 2   # 2 questions x 1 attempt
    metrics = json.loads((root / "report" / "metrics.json").read_text())
    assert metrics["systems"] == ["C-MAS base", "C-MAS + RL", "MultiAgent-OPD"]
    exported = json.loads((root / "stage2" / "export" / "mopd_export.json").read_text())
    assert exported["step"] == stage2_steps                   # the arm is read at its last step
    assert (root / "pipeline.yaml").is_file() and (root / "timings.json").is_file()
    # the teacher checked on dev before Stage II: its table in the report
    check = json.loads((root / "teacher_check" / "teacher_check.json").read_text())
    assert check["distilled_by"] == ["MultiAgent-OPD"] and sum(r["questions"] for r in check["types"]) == 3
    assert "## The teacher before it teaches" in (root / "report" / "report.md").read_text()
    assert "teacher_check" in json.loads((root / "timings.json").read_text())


@pytest.mark.slow
def test_a_pipeline_from_yaml_runs_end_to_end_then_reuses_every_stage(tiny, tmp_path, capfd):
    f = tmp_path / "tiny.yaml"
    f.write_text(pipeline_yaml(tiny))
    root = tmp_path / "yaml_run"
    assert main(["pipeline", "--file", str(f), f"root={root}", "stage2.mopd.steps=1"]) == 0
    _check_outputs(root, stage2_steps=1)
    built = _stamps(root)
    capfd.readouterr()
    assert main(["pipeline", "--file", str(f), f"root={root}", "stage2.mopd.steps=1"]) == 0
    err = capfd.readouterr().err
    assert _stamps(root) == built
    for line in ("C-MAS + RL: reusing", "MultiAgent-OPD: reusing", "eval C-MAS base: reusing",
                 "eval MultiAgent-OPD: reusing", "report: reusing"):
        assert line in err
    assert "training" not in err
    # another step count is another stage: the old run is moved aside, the arm trained again and
    # evaluated again; Stage I and the systems it does not touch are reused
    assert main(["pipeline", "--file", str(f), f"root={root}"]) == 0
    _check_outputs(root, stage2_steps=2)
    again = _stamps(root)
    assert (root / "stage2.replaced-1" / "export" / "model.safetensors").is_file()
    assert [rel for rel in BUILT if again[rel] != built[rel]] == [
        "stage2/DONE", "stage2/metrics.jsonl", "stage2/export/model.safetensors", "report/report.md",
        "report/metrics.json", "eval/multiagent_opd/records.jsonl"]
    # Stage I exported at another step is a new teacher under the same path: Stage II trains again
    # from it (its run moved aside), and what evaluates either model runs again
    assert main(["pipeline", "--file", str(f), f"root={root}", "stage1.export=last"]) == 0
    third = _stamps(root)
    changed = [rel for rel in BUILT if third[rel] != again[rel]]
    assert "eval/c_mas_base/records.jsonl" not in changed
    assert {"stage1/export/model.safetensors", "stage2/DONE", "stage2/metrics.jsonl",
            "eval/c_mas_plus_rl/records.jsonl"} <= set(changed)
    assert json.loads((root / "stage1" / "export" / "mopd_export.json").read_text())["step"] == 2
    assert not (root / "stage1.replaced-1").exists() and (root / "stage2.replaced-2").is_dir()


def test_an_interrupted_stage_resumes_from_its_checkpoint(tiny, monkeypatch):
    from mopd.train.trainer import PolicyTrainer

    train_step = PolicyTrainer.train_step

    def interrupted_after_step_1(self):
        if self.step == 1 and self.run_dir.name == "stage1":
            raise KeyboardInterrupt   # Ctrl-C (or SIGTERM) as Stage I's second step starts
        return train_step(self)

    monkeypatch.setattr(PolicyTrainer, "train_step", interrupted_after_step_1)
    root = Path(tiny.root)
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(tiny)
    assert not (root / "stage1" / "DONE").exists() and not (root / "stage2").exists()
    assert [p.name for p in (root / "stage1" / "checkpoints").glob("step_*")] == ["step_000001"]
    monkeypatch.setattr(PolicyTrainer, "train_step", train_step)
    run_pipeline(tiny)
    events = [json.loads(x) for x in (root / "stage1" / "events.jsonl").read_text().splitlines()]
    assert any(e["kind"] == "resume" and e["step"] == 1 and "resumed from" in e["message"] for e in events)
    _check_outputs(root)


@pytest.mark.slow
def test_the_subprocess_launcher_runs_each_stages_command(tiny_model_dir, qa_file, tmp_path, monkeypatch):
    cfg = tiny_pipeline(tiny_model_dir, qa_file, tmp_path / "run", launcher="subprocess")
    report = run_pipeline(cfg)
    root = tmp_path / "run"
    assert report == root / "report" / "report.md" and report.is_file()
    _check_outputs(root)
    run = json.loads((root / "eval" / "multiagent_opd" / "run.json").read_text())
    assert run["settings"]["attempts"] == 1 and run["settings"]["workflow"] == "hmas"
    assert len((root / "eval" / "questions.jsonl").read_text().splitlines()) == 2
    built = _stamps(root)

    def no_command(*a, **k):
        raise AssertionError("a done stage ran again")

    import mopd.pipeline.run

    monkeypatch.setattr(mopd.pipeline.run.subprocess, "call", no_command)
    run_pipeline(cfg)
    assert _stamps(root) == built
