"""`mopd eval run`'s choices before anything loads: no silent bundled corpus, vLLM
by default on a GPU, vLLM's memory share from what is free."""

import argparse

import pytest
import torch

import mopd.eval.commands as commands
from mopd.cli import main
from mopd.config import resolve
from mopd.core.qa import QAExample, write_questions


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from tests.helpers.tiny_model import init_tiny_model

    return init_tiny_model(tmp_path_factory.mktemp("tiny") / "model", hidden=32, layers=1, heads=2, ffn=64,
                           max_positions=4096)


@pytest.fixture()
def manifest(tmp_path):
    path = tmp_path / "test.jsonl"
    write_questions(path, [QAExample("q0", "nq", "Where was band 0 formed?", ["Paris"])])
    return path


def _run(model, manifest, out, *overrides):
    return main(["eval", "run", "--model", str(model), "--workflow", "cmas", "--manifest", str(manifest),
                 "--attempts", "1", "--out", str(out), *overrides])


def test_no_retriever_is_refused_in_one_line_before_anything_loads(tiny_model, manifest, tmp_path, capsys,
                                                                   monkeypatch):
    import mopd.retriever

    monkeypatch.setattr(mopd.retriever, "load_retriever", lambda cfg: pytest.fail("no retriever was asked for"))
    assert _run(tiny_model, manifest, tmp_path / "run") == 2
    err = capsys.readouterr().err.strip()
    assert "no retriever" in err and "retriever.index" in err and "retriever.url" in err
    assert "\n" not in err and "Traceback" not in err
    assert _run(tiny_model, manifest, tmp_path / "run", f"retriever.index={tmp_path / 'none'}") == 2
    assert "retriever.index=" in capsys.readouterr().err and not (tmp_path / "run").exists()


class _Built(Exception):
    """Raised by the patched build_engine: what the engine would have been built with."""


def _capture_engine(monkeypatch, free_gib=None, total_gib=80.0):
    import mopd.retriever
    import mopd.rollout.engines

    class _Retriever:
        def search(self, queries, k):
            return [[] for _ in queries]

    def build(rollout_cfg, model_path, **kw):
        raise _Built(rollout_cfg)

    monkeypatch.setattr(mopd.retriever, "load_retriever", lambda cfg: _Retriever())
    monkeypatch.setattr(mopd.rollout.engines, "build_engine", build)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(commands, "vllm_installed", lambda: True)
    if free_gib is not None:
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (int(free_gib * 2 ** 30), int(total_gib * 2 ** 30)))


def test_on_a_gpu_evaluation_defaults_to_vllm_with_the_free_memory_share(tiny_model, manifest, tmp_path, capsys,
                                                                         monkeypatch):
    # 46 GiB free of 80 (a retriever and another job hold the rest): (46 - 2 headroom) / 80 = 0.55
    _capture_engine(monkeypatch, free_gib=46.0)
    with pytest.raises(_Built) as e:
        _run(tiny_model, manifest, tmp_path / "run", "retriever.index=bundled")
    rollout = e.value.args[0]
    assert rollout.engine == "vllm" and rollout.gpu_memory_utilization == 0.55
    out = capsys.readouterr().out
    assert "rollout.engine vllm" in out and "rollout.gpu_memory_utilization 0.55" in out
    with pytest.raises(_Built) as e:   # plenty free: at most 0.85
        _capture_engine(monkeypatch, free_gib=79.0)
        _run(tiny_model, manifest, tmp_path / "run", "retriever.index=bundled")
    assert e.value.args[0].gpu_memory_utilization == 0.85
    with pytest.raises(_Built) as e:   # set by the user: kept
        _run(tiny_model, manifest, tmp_path / "run", "retriever.index=bundled", "rollout.gpu_memory_utilization=0.3")
    assert e.value.args[0].gpu_memory_utilization == 0.3


def test_an_engine_the_user_set_is_kept_and_a_cpu_stays_on_hf(tiny_model, manifest, tmp_path, capsys, monkeypatch):
    _capture_engine(monkeypatch)
    with pytest.raises(_Built) as e:
        _run(tiny_model, manifest, tmp_path / "run", "retriever.index=bundled", "rollout.engine=hf")
    assert e.value.args[0].engine == "hf" and e.value.args[0].gpu_memory_utilization is None
    assert "rollout.engine" not in capsys.readouterr().out
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(_Built) as e:
        _run(tiny_model, manifest, tmp_path / "run", "retriever.index=bundled")
    assert e.value.args[0].engine == "hf"


def test_engine_set_by_the_command_line_or_the_yaml_file(tmp_path):
    def args(overrides=(), yaml_file=None, preset=None):
        return argparse.Namespace(overrides=list(overrides), yaml_file=yaml_file, preset=preset)

    assert not commands.engine_set_by_user(args())
    assert not commands.engine_set_by_user(args(["rollout.seed=3"], preset="hmas_base"))
    assert commands.engine_set_by_user(args(["rollout.engine=hf"]))
    assert commands.engine_set_by_user(args(["--rollout.engine", "hf"]))
    y = tmp_path / "c.yaml"
    y.write_text("rollout:\n  engine: hf\n")
    assert commands.engine_set_by_user(args(yaml_file=str(y)))
    y.write_text("rollout:\n  seed: 2\n")
    assert not commands.engine_set_by_user(args(yaml_file=str(y)))


def test_without_vllm_a_gpu_stays_on_hf_and_says_so():
    cfg = resolve(None)
    line = commands.choose_engine(cfg, engine_set=False, cuda=True, have_vllm=False)
    assert cfg.rollout.engine == "hf" and "not installed" in line
    assert commands.choose_engine(cfg, engine_set=False, cuda=True, have_vllm=True).startswith("rollout.engine vllm")
    assert cfg.rollout.engine == "vllm"


@pytest.mark.parametrize("overrides, preset, workflow, steps", [
    (["rollout.max_steps=4"], None, "hmas", 4),      # set by the user: kept for another workflow
    ([], None, "hmas", 12),                          # not set: the paper's H-MAS limit
    (["rollout.max_steps=3"], "hmas_base", "hmas", 3),
    ([], None, "cmas", 5),
])
def test_a_step_limit_the_user_set_is_kept_for_another_workflow(overrides, preset, workflow, steps):
    from mopd.config import resolve

    args = argparse.Namespace(overrides=overrides, yaml_file=None, preset=preset, workflow=workflow)
    cfg = resolve(preset, overrides)
    settings = commands.evaluation_settings(cfg, args)
    assert (settings.workflow, settings.max_steps, settings.temperature) == (workflow, steps, 0.6)
