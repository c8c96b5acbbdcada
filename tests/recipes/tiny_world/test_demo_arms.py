"""The demo's Stage II arms: a controlled comparison (only the Searcher's loss differs), trained
side by side with the same weights as one after the other, read at their last step."""

import dataclasses
import json
import shutil

import pytest
import torch

from mopd.config import to_yaml
from mopd.recipes.tiny_world.demo import demo_config
from mopd.recipes.tiny_world.pipeline import ABLATION_ARMS, STAGE2_ARMS, DemoSettings
from mopd.pipeline.stages import TrainStage, plan


def _arm_configs(s: DemoSettings) -> dict:
    """The resolved config of every Stage II arm of the demo with settings ``s``, by run directory."""
    return {st.spec.dir: st.config for st in plan(demo_config(s)) if isinstance(st, TrainStage) and st.group == "stage2"}


def _flat(cfg) -> dict:
    import yaml

    out = {}

    def walk(node, prefix=""):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}{k}.")
        else:
            out[prefix[:-1]] = node

    walk(yaml.safe_load(to_yaml(cfg)))
    return out


def test_primary_arms_differ_only_in_the_searchers_loss(tmp_path):
    s = DemoSettings(out=str(tmp_path), seed=3, overrides=["trainer.lr=7e-4"])
    opd, control = (_flat(_arm_configs(s)[a.dir]) for a in STAGE2_ARMS)
    differ = sorted(k for k in opd.keys() | control.keys() if opd.get(k) != control.get(k))
    assert all(k in ("method", "description", "trainer.out_dir") or k.startswith("algo.roles.searcher.")
               for k in differ), differ
    assert opd["algo.roles.searcher.advantage"] == "opd" and control["algo.roles.searcher.pg_coef"] == 0.0
    for c in (opd, control):   # same start, teacher, KL reference, seed, lr override, steps
        assert c["model.path"] == f"{tmp_path}/pi0" and c["teacher.path"] == str(tmp_path / "stage1" / "export")
        assert c["trainer.seed"] == 3 and c["rollout.seed"] == 3 and c["trainer.lr"] == 7e-4
        assert c["trainer.steps"] == s.stage2_steps and c["trainer.cpu_threads"] == 1


def test_stage1_and_every_arm_have_the_same_rl_budget_by_default(tmp_path):
    """C-MAS + RL against a Stage II arm is weighed at equal rollouts: the same steps, questions
    per step, workflows per question and learning rate (only the workflow and the losses differ)."""
    s = DemoSettings(out=str(tmp_path), with_ablations=True)
    stages = {st.spec.dir: _flat(st.config) for st in plan(demo_config(s)) if isinstance(st, TrainStage)}
    assert len(stages) == 1 + len(STAGE2_ARMS) + len(ABLATION_ARMS)
    budget = {d: (c["trainer.steps"], c["trainer.questions_per_step"], c["rollout.group_size"], c["trainer.lr"],
                  c["trainer.ppo_minibatches"]) for d, c in stages.items()}
    assert len(set(budget.values())) == 1, budget
    assert budget["stage1"][0] == s.stage1_steps == s.stage2_steps


def test_base_teacher_arm_distils_from_pi0_with_stage1_as_reference(tmp_path):
    s = DemoSettings(out=str(tmp_path), with_ablations=True)
    arm = next(a for a in ABLATION_ARMS if a.preset == "tiny_base_teacher")
    cfg = _arm_configs(s)[arm.dir]
    assert cfg.teacher.path == f"{tmp_path}/pi0" and cfg.reference_path() == str(tmp_path / "stage1" / "export")


def test_settings_refuse_zero_workers_or_threads(tmp_path):
    for kw in ({"arm_workers": 0}, {"threads": 0}):
        with pytest.raises(ValueError):
            DemoSettings(out=str(tmp_path), **kw)


@pytest.mark.slow
def test_arms_side_by_side_equal_arms_one_after_the_other(tmp_path):
    """Two worker processes give every arm the weights one process gives it, and each arm is
    exported at its last step."""
    from safetensors.torch import load_file

    from mopd.recipes.tiny_world.demo import run_demo

    a = tmp_path / "a"
    s = DemoSettings(out=str(a), quick=True, stage1_steps=1, stage2_steps=2, test_questions=2, attempts=1,
                     bootstrap_draws=50, pi0_check_attempts=0)
    run_demo(s)
    side_by_side = {}
    for arm in STAGE2_ARMS:
        side_by_side[arm.name] = load_file(a / arm.dir / "export" / "model.safetensors")
        exported = json.loads((a / arm.dir / "export" / "mopd_export.json").read_text())
        assert exported["step"] == 2, (arm.name, exported)
        shutil.rmtree(a / arm.dir)   # this run's own directories: trained again, one after the other
    run_demo(dataclasses.replace(s, arm_workers=1))
    for arm in STAGE2_ARMS:
        w = load_file(a / arm.dir / "export" / "model.safetensors")
        ref = side_by_side[arm.name]
        assert w.keys() == ref.keys() and all(torch.equal(w[k], ref[k]) for k in w), arm.name


def test_an_evaluation_of_another_model_is_set_aside_not_reused(tmp_path):
    """A stage retrained (other steps) gives another export in the same directory: the demo's old
    evaluation of it is moved aside (kept), an evaluation with the same settings stays."""
    from mopd.pipeline.inprocess import set_aside_if_stale

    def _set_aside_if_stale(out, settings):
        set_aside_if_stale(out, settings, log=lambda line: None)

    out = tmp_path / "eval" / "multiagent_opd"
    out.mkdir(parents=True)
    (out / "run.json").write_text(json.dumps({"settings": {"model_weights": "aaa", "attempts": 4}}))
    (out / "records.jsonl").write_text("{}\n")
    _set_aside_if_stale(out, {"model_weights": "aaa", "attempts": 4})
    assert (out / "records.jsonl").is_file()
    for n in (1, 2):
        _set_aside_if_stale(out, {"model_weights": "bbb", "attempts": 4})
        assert not out.exists() and (tmp_path / "eval" / f"multiagent_opd.replaced-{n}" / "records.jsonl").is_file()
        out.mkdir()
        (out / "run.json").write_text(json.dumps({"settings": {"model_weights": "ccc"}}))
        (out / "records.jsonl").write_text("{}\n")
