"""Pipeline configs: presets, ${root}, a YAML layer and dotted overrides, and the checks that
refuse a pipeline before anything runs."""

import re

import pytest

from mopd.config import ConfigError
from mopd.pipeline.presets import PIPELINES, pipeline_yaml, resolve_pipeline, show_pipeline


def test_the_paper_preset_trains_two_arms_and_evaluates_the_papers_five_systems():
    cfg = resolve_pipeline("paper")
    assert cfg.launcher.kind == "subprocess" and cfg.launcher.gpus == 8
    assert cfg.stage1.preset == "cmas_rl" and [a.preset for a in cfg.stage2.values()] == ["mopd", "prompted_critic"]
    assert [s.name for s in cfg.systems] == ["C-MAS base", "C-MAS + RL", "H-MAS base", "Prompted Critic",
                                             "MultiAgent-OPD"]
    assert cfg.model_of(cfg.systems[-1]) == "runs/paper/stage2/export" and cfg.reference_system() == "MultiAgent-OPD"
    assert set(PIPELINES) >= {"paper", "demo", "demo_quick"}


def test_root_moves_every_path_of_the_demo_preset():
    cfg = resolve_pipeline("demo", ["root=/data/run7"])
    assert cfg.model == "/data/run7/pi0" and cfg.retriever.index == "/data/run7/world/index"
    assert (cfg.data.train, cfg.data.test) == ("/data/run7/world/questions/train.jsonl",
                                               "/data/run7/world/questions/test.jsonl")


def test_a_yaml_layer_then_overrides(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text("model: /models/q\nstage1:\n  steps: 7\n  overrides: [trainer.lr=2.0e-6]\n"
                 "stage2:\n  mopd:\n    steps: 9\n  prompted_critic: null\nsystems:\n"
                 "  - {name: C-MAS + RL, model: stage1, workflow: cmas}\n  - {name: MultiAgent-OPD, model: mopd, workflow: hmas}\n")
    cfg = resolve_pipeline("paper", ["stage2.mopd.steps=11", "--launcher.gpus", "16",
                                     "launcher.train=torchrun --nproc_per_node 16 -m mopd"], str(f))
    assert cfg.model == "/models/q" and cfg.stage1.steps == 7 and cfg.stage1.overrides == ["trainer.lr=2.0e-6"]
    assert list(cfg.stage2) == ["mopd"] and cfg.stage2["mopd"].steps == 11          # the override is the last word
    assert cfg.stage2["mopd"].preset == "mopd" and cfg.launcher.gpus == 16          # the rest stays the preset's
    assert [s.name for s in cfg.systems] == ["C-MAS + RL", "MultiAgent-OPD"]


def test_shown_yaml_is_a_whole_pipeline_that_root_still_moves(tmp_path):
    f = tmp_path / "demo.yaml"
    f.write_text(show_pipeline("demo"))
    assert "${root}/pi0" in f.read_text()
    assert resolve_pipeline(None, ["root=/r"], str(f)) == resolve_pipeline("demo", ["root=/r"])
    resolved = tmp_path / "paper.yaml"
    resolved.write_text(pipeline_yaml(resolve_pipeline("paper")))
    assert resolve_pipeline(None, [], str(resolved)) == resolve_pipeline("paper")


@pytest.mark.parametrize("overrides, message", [
    (["stage1.stepz=3"], "unknown pipeline key 'stage1.stepz'; did you mean stage1.steps"),
    (["stage1.export=middle"], "stage1.export='middle'"),
    (["stage1.preset=cmas_rll"], "is not a method preset"),
    (["stage1.dir=../elsewhere"], "must be a relative directory"),
    (["stage2.mopd.dir=stage1"], "is also stage1's run directory"),
    (["stage2.prompted_critic=null"], "systems[3].model='prompted_critic'"),
    (["report.reference=Nobody"], "report.reference='Nobody'"),
    (["eval.split=val"], "eval.split='val'"),
    (["launcher.train=torchrun --nproc_per_node 8"], "must end with mopd"),
    (["launcher.gpus=4"], "starts 8 processes (1 node(s) x 8) but launcher.gpus=4"),
    (["launcher.train=torchrun --nnodes 2 --nproc-per-node=8 -m mopd"], "starts 16 processes (2 node(s) x 8)"),
    (["overrides=[trainer.lr]"], "is not a config override"),
    (["stage1.steps=many"], "bad value for 'stage1.steps'"),
])
def test_a_bad_pipeline_is_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as e:
        resolve_pipeline("paper", overrides)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_an_unknown_preset_or_file_is_named():
    with pytest.raises(ConfigError, match="unknown pipeline 'papr' \\(did you mean 'paper'\\?\\)"):
        resolve_pipeline("papr")
    with pytest.raises(ConfigError, match="pipeline file /nonexistent.yaml does not exist"):
        resolve_pipeline("paper", [], "/nonexistent.yaml")


def test_a_bad_world_setting_is_refused_before_anything_is_built():
    with pytest.raises(ConfigError, match="setup.world: "):
        resolve_pipeline("demo", ["setup.world.settings=[bands=many]"])


def test_setup_stages_run_in_this_process_only():
    with pytest.raises(ConfigError, match="need launcher.kind=inprocess"):
        resolve_pipeline("demo", ["launcher.kind=subprocess"])


def test_a_setup_stage_of_an_unknown_kind_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="setup.world.kind: unknown setup stage kind 'nope'.*setup stage kinds: \\["):
        resolve_pipeline("demo", ["setup.world.kind=nope"])


@pytest.mark.parametrize("override, message", [
    ("setup.world.settings=[quick=maybe]", "setup.world: world setting 'quick=maybe'"),
    ("setup.pi0.settings=[threads=0]", "setup.pi0: threads=0 must be > 0"),
    ("setup.pi0_check.settings=[weak_em=2]", "setup.pi0_check: weak-pi_0 threshold em=2"),
])
def test_a_setup_stages_own_setting_is_checked_with_the_config(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        resolve_pipeline("demo", [override])
