"""`mopd demo --lora` (the demo_lora presets): Stage I and both Stage II arms train LoRA adapters over
pi_0, Stage I's adapter alone is the arms' teacher, and everything else (world, pi_0, its check, the
systems, the evaluation) is the full demo's."""

import json
import math

import pytest

import mopd.recipes.tiny_world.warmstart
import mopd.recipes.tiny_world.world
from mopd.cli import main
from mopd.pipeline.presets import resolve_pipeline
from mopd.pipeline.stages import TrainStage, plan
from mopd.recipes.tiny_world.pipeline import LORA_OVERRIDES, DemoSettings, demo_pipeline
from mopd.recipes.tiny_world.report import training_note
from tests.helpers.dry_run import refuse_loading


def test_the_lora_preset_trains_every_stage_as_adapters_and_keeps_the_rest_of_the_demo():
    full, lora = resolve_pipeline("demo"), resolve_pipeline("demo_lora")
    assert (lora.name, lora.root) == ("demo_lora", "runs/demo_lora")
    assert resolve_pipeline("demo_lora_quick").root == "runs/demo_lora_quick"
    assert lora.setup == full.setup and lora.systems == full.systems and lora.eval == full.eval
    assert lora.report == full.report and lora.launcher == full.launcher
    assert lora.stage1.overrides == LORA_OVERRIDES + full.stage1.overrides
    assert [a.overrides for a in lora.stage2.values()] == [LORA_OVERRIDES + a.overrides for a in full.stage2.values()]
    trains = {s.key: s.config for s in plan(lora) if isinstance(s, TrainStage)}
    assert sorted(trains) == ["stage1", "stage2.mopd", "stage2.no_searcher_supervision"]
    for key, c in trains.items():
        assert (c.model.lora.rank, c.model.lora.alpha, c.trainer.lr) == (16, 32.0, 5e-3), key
        assert c.model.path == "runs/demo_lora/pi0"
    assert trains["stage2.mopd"].teacher.path == "runs/demo_lora/stage1/export_adapter"
    # the full demo: no adapters, its lr, the merged teacher as before
    for s in plan(full):
        if isinstance(s, TrainStage):
            assert not s.config.model.lora.enabled and s.config.trainer.lr == 5e-4
    assert "stage1.export_adapter" not in [s.key for s in plan(full)]


def test_a_user_override_comes_after_the_lora_settings():
    cfg = resolve_pipeline(demo_pipeline(DemoSettings(lora=True, overrides=["trainer.lr=2e-3"])))
    s1 = next(s for s in plan(cfg) if s.key == "stage1")
    assert (s1.config.trainer.lr, s1.config.model.lora.rank) == (2e-3, 16)


def test_the_lora_dry_run_shows_the_adapters_and_the_adapter_export(monkeypatch, capsys, tmp_path):
    refuse_loading(monkeypatch, (mopd.recipes.tiny_world.world, "build_world"),
                   (mopd.recipes.tiny_world.warmstart, "build_pi0"))
    root = tmp_path / "d"
    assert main(["pipeline", "demo_lora_quick", "--dry-run", f"root={root}"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"pipeline demo_lora_quick: 19 stages under {root}")   # with the teacher check
    for key in ("world", "pi0", "pi0_check", "stage1", "stage1.export", "stage1.export_adapter", "teacher_check",
                "stage2.mopd", "stage2.no_searcher_supervision", "eval.multiagent_opd", "report"):
        assert f"] {key}: " in out
    assert out.count("model.lora.rank=16 model.lora.alpha=32 trainer.lr=5e-3") == 3
    assert f"mopd export {root}/stage1 --checkpoint best --adapter --out {root}/stage1/export_adapter" in out
    assert out.count(f"teacher.path={root}/stage1/export_adapter") == 2
    assert f"eval run --model {root}/stage1/export --workflow cmas" in out


@pytest.mark.parametrize("argv, out", [
    ([], "runs/demo_lora"), (["--quick"], "runs/demo_lora_quick"), (["--seeds", "1"], "runs/demo_lora_seeds"),
    (["--out", "elsewhere"], "elsewhere")])
def test_mopd_demo_lora_never_writes_into_a_full_demos_directory(monkeypatch, argv, out):
    import mopd.recipes.tiny_world.demo as demo

    seen = []
    monkeypatch.setattr(demo, "run_demo", lambda s: seen.append(s) or "report.md")
    monkeypatch.setattr(demo, "run_seeds", lambda s, seeds: seen.append(s) or "summary.md")
    assert main(["demo", "--lora", *argv]) == 0
    assert seen[0].out == out and seen[0].lora


def test_the_report_says_how_each_stage_trained_only_when_one_trained_adapters(tmp_path):
    def run(name, rank, lr):
        d = tmp_path / name
        d.mkdir()
        (d / "config.yaml").write_text(f"model:\n  lora:\n    rank: {rank}\n    alpha: 8.0\n    target_modules:\n"
                                       f"    - q_proj\n    - v_proj\ntrainer:\n  lr: {lr}\n")
        return d

    full = [run("a", 0, 5e-4), run("b", 0, 3e-4)]
    assert training_note(full, ["Stage I", "Stage II"]) == ""
    note = training_note([run("c", 4, 0.003), run("d", 0, 5e-4)], ["Stage I", "Stage II"])
    assert note.startswith("## Training\n")
    assert "- Stage I: LoRA adapters of rank 4, alpha 8, on q_proj, v_proj, over pi_0's frozen weights; lr 0.003" in note
    assert "- Stage II: all weights; lr 0.0005" in note


@pytest.mark.slow
def test_the_quick_lora_demo_runs_end_to_end(tmp_path):
    from mopd.recipes.tiny_world.demo import run_demo
    from mopd.recipes.tiny_world.pipeline import quick_settings

    out = tmp_path / "demo_lora"
    report = run_demo(quick_settings(DemoSettings(out=str(out), lora=True)))
    assert report == out / "report" / "report.md"
    assert (out / "stage1" / "export_adapter" / "adapter_config.json").is_file()
    for stage in ("stage1", "stage2", "stage2_no_searcher_supervision"):
        assert (out / stage / "export" / "model.safetensors").is_file()       # merged: a plain model
        assert not (out / stage / "export" / "adapter_config.json").exists()
        config = (out / stage / "config.yaml").read_text()
        assert "rank: 16" in config and "lr: 0.005" in config
    assert sorted(p.name for p in (out / "eval").iterdir()) == [
        "c_mas_base", "c_mas_plus_rl", "h_mas_base", "multiagent_opd", "no_searcher_supervision"]
    text = report.read_text()
    assert text.startswith("# MultiAgent-OPD on the built-in tiny world, LoRA\n") and "## Training" in text
    claims = json.loads((out / "report" / "claims.json").read_text())
    assert len(claims) == 4 and all(math.isfinite(c["diff"]) for c in claims)
    assert json.loads((out / "demo_settings.json").read_text())["lora"] is True
