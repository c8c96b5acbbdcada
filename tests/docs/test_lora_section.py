"""docs/gpu_training.md's LoRA section, command by command through the CLI, on the tiny run (the
tier's substitutions): the plan, Stage I with --export-adapter, its --resume, Stage II with the
Stage-I adapter as teacher, both exports, the adapter's evaluation, then the paper's pipeline with
adapters through its subprocess commands."""

from __future__ import annotations

import json

import pytest

from tests.docs.sequences import sequence

pytestmark = pytest.mark.slow

def lora_commands():
    commands = sequence("lora")
    pipeline = [c for c in commands if c.text.startswith("mopd pipeline paper")]
    assert len(pipeline) == 1 and commands[-1] is pipeline[0]
    return commands[:-1], pipeline[0]


def test_the_lora_section_runs_command_by_command(tiny_assets, tmp_path):
    from tests.docs.runner import DocShell

    shell = DocShell(tmp_path / "work", tiny_assets)
    commands, _ = lora_commands()
    texts = [c.text for c in commands]
    assert any("--export-adapter" in t and "--resume" not in t for t in texts)
    assert any("--resume" in t for t in texts) and any("teacher.path=runs/stage1/adapter" in t for t in texts)
    for cmd in commands:
        shell.run(cmd)
    run = shell.cwd / "runs"
    assert json.loads((run / "stage1" / "adapter" / "adapter_config.json").read_text())["r"] == 16
    assert (run / "stage2" / "export" / "config.json").exists()
    assert (run / "stage2" / "adapter" / "adapter_model.safetensors").exists()
    assert not (run / "stage2" / "adapter" / "config.json").exists()   # the adapter alone
    assert (run / "stage2" / "eval" / "records.jsonl").read_text().strip()


def test_the_paper_pipeline_with_lora_runs_through_its_subprocess_commands(tiny_assets, tmp_path):
    from tests.docs.runner import DocShell

    shell = DocShell(tmp_path / "work", tiny_assets)
    _, pipeline = lora_commands()
    out = shell.run(pipeline)
    assert "stage2.mopd" in out
    assert (shell.cwd / "runs" / "paper" / "report" / "report.md").exists()
