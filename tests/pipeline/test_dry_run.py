"""`mopd pipeline PRESET --dry-run`: every stage with its command, memory per GPU and disk, and
nothing loaded or run."""

import subprocess
import sys

import pytest

from mopd.cli import main
from mopd.pipeline.presets import PAPER_MODEL
from tests.helpers.dry_run import refuse_loading


@pytest.fixture
def nothing_loads(monkeypatch):
    """Every loader and launcher a stage uses fails the test when called."""
    refuse_loading(monkeypatch)


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def test_the_papers_dry_run_names_every_stage_its_command_memory_and_disk(nothing_loads, capsys, tmp_path):
    from mopd.train.memory_plan import ModelShape, load_model_config

    assert main(["pipeline", "paper", "--dry-run", f"root={tmp_path}/paper"]) == 0
    out = capsys.readouterr().out
    params = ModelShape.from_config(load_model_config(PAPER_MODEL)).params
    checkpoints, export = 4 * 12 * params, 4 * params      # 3 kept + the best, 12 B each; the export in fp32
    for key in ("stage1", "stage1.export", "stage2.mopd", "stage2.mopd.export", "stage2.prompted_critic",
                "stage2.prompted_critic.export", "eval.c_mas_base", "eval.c_mas_plus_rl", "eval.h_mas_base",
                "eval.prompted_critic", "eval.multiagent_opd", "report"):
        assert f"] {key}: " in out, key
    blocks = out.split("\n[")[1:]
    assert len(blocks) == 15 and all("command: " in b and "memory per GPU: " in b and "disk: " in b for b in blocks)
    assert f"torchrun --nproc_per_node 8 -m mopd train --resume-or-start cmas_rl model.path={PAPER_MODEL}" in out
    assert f"mopd export {tmp_path}/paper/stage1 --checkpoint best --out {tmp_path}/paper/stage1/export" in out
    assert "mopd eval run --model" in out and "mopd eval report" in out
    # Each evaluation on the 8 GPUs, a share of the questions per rank (mopd/eval/ranks.py)
    # five systems and the teacher check's two (the base and Stage I's export on dev)
    assert out.count("torchrun --nproc_per_node 8 -m mopd eval run --model") == 7
    assert out.count("memory per GPU: vLLM on each of 8 GPUs (one rank each") == 7
    train_memory = [line for line in out.splitlines() if "memory per GPU: training" in line]
    assert len(train_memory) == 3 and all("of 80 on each of 8 GPU(s)" in line for line in train_memory)
    assert out.count(f"disk: {_gb(checkpoints)} (4 checkpoints") == 3 and out.count(f"disk: {_gb(export)} (fp32") == 3
    assert f"disk in all: {_gb(3 * (checkpoints + export))}" in out
    assert "to run" in out and "nothing was loaded or run" in out
    assert not (tmp_path / "paper").exists()


def test_a_model_without_config_json_has_unknown_disk(nothing_loads, capsys, tmp_path):
    assert main(["pipeline", "paper", "--dry-run", f"model={tmp_path}/missing", f"root={tmp_path}/r"]) == 0
    out = capsys.readouterr().out
    assert "disk: unknown (unknown (no config.json for" in out and "memory per GPU: unknown" in out
    assert "(model size unknown)" in out


def test_a_dry_run_imports_no_torch():
    code = ("import sys; from mopd.cli import main; rc = main(['pipeline', 'paper', '--dry-run']); "
            "print('torch' in sys.modules, 'transformers' in sys.modules, rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "False False 0"


def test_the_readmes_pipeline_commands_plan_without_loading(nothing_loads, capsys):
    from tests.helpers.readme import gpu_section_commands

    commands = gpu_section_commands("pipeline")
    assert [c[:2] for c in commands] == [["pipeline", "paper"], ["pipeline", "paper"]]
    for argv in commands:
        assert main([*argv, "--dry-run"] if "--dry-run" not in argv else argv) == 0
    assert "pipeline paper: 15 stages under runs/paper" in capsys.readouterr().out


def test_the_base_models_evaluations_read_its_hugging_face_cache_snapshot(nothing_loads, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert main(["pipeline", "paper", "--dry-run"]) == 0
    assert "the run would stop before its first stage: model=Qwen/Qwen3-4B-Instruct-2507 is neither a local" in \
        capsys.readouterr().out
    repo = tmp_path / "hub" / "models--Qwen--Qwen3-4B-Instruct-2507"
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    assert main(["pipeline", "paper", "--dry-run"]) == 0
    out = capsys.readouterr().out
    # C-MAS and H-MAS base, and the base in the teacher check
    assert out.count(f"mopd eval run --model {repo / 'snapshots' / 'abc123'} --workflow") == 3
    assert "would stop" not in out
