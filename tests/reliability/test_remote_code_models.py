"""A model directory that needs its own Python code (``auto_map``, no ``model_type``) is refused in
one line by every command that loads a model, never asked about and never run, unless
``model.trust_remote_code=true`` opts in (recorded in run.json)."""

import json
import shutil

import pytest

from mopd.config import resolve
from mopd.core.model_dir import model_dir_problem, remote_code_trusted, trust_remote_code
from mopd.pipeline.presets import pipeline_yaml
from mopd.train.run_dir import run_identity
from tests.helpers.cli import one_line_error
from tests.pipeline.conftest import tiny_pipeline
from tests.reliability.runs import write_run


@pytest.fixture()
def remote_model(tiny_model_dir, tmp_path):
    """The tiny model, with a config that asks for code of its own which would create a marker."""
    d = tmp_path / "remote_model"
    shutil.copytree(tiny_model_dir, d)
    conf = json.loads((d / "config.json").read_text())
    conf.pop("model_type")
    conf["auto_map"] = {"AutoConfig": "custom.CustomConfig", "AutoModelForCausalLM": "custom.CustomModel"}
    (d / "config.json").write_text(json.dumps(conf))
    (d / "custom.py").write_text(f"open({str(tmp_path / 'marker')!r}, 'w').close()\n")
    return d


@pytest.fixture(autouse=True)
def _untrusted():
    trust_remote_code(False)
    yield
    trust_remote_code(False)


def test_eval_run_refuses_it_in_one_line(remote_model, qa_file, tmp_path, capsys):
    one_line_error(capsys, ["eval", "run", "--model", str(remote_model), "--workflow", "cmas", "--manifest", qa_file,
                            "--out", str(tmp_path / "ev")], "auto_map", "model.trust_remote_code=true")
    assert not (tmp_path / "marker").exists() and not (tmp_path / "ev").exists()


def test_train_refuses_it_in_one_line(remote_model, qa_file, tmp_path, capsys):
    one_line_error(capsys, ["train", "tiny_cmas_rl", f"model.path={remote_model}", f"data.train={qa_file}",
                            f"trainer.out_dir={tmp_path / 'run'}"], "auto_map", "model.trust_remote_code=true")
    assert not (tmp_path / "marker").exists() and not (tmp_path / "run").exists()


def test_export_refuses_it_as_base_model_in_one_line(remote_model, tiny_model_dir, tmp_path, capsys):
    write_run(tmp_path / "run", tiny_model_dir, steps=(1,))
    capsys.readouterr()
    one_line_error(capsys, ["export", str(tmp_path / "run"), "--base-model", str(remote_model), "--out",
                            str(tmp_path / "hf")], "auto_map", "--trust-remote-code")
    assert not (tmp_path / "marker").exists() and not (tmp_path / "hf").exists()


def test_pipeline_refuses_it_in_one_line(remote_model, qa_file, tmp_path, capsys):
    f = tmp_path / "pipeline.yaml"
    f.write_text(pipeline_yaml(tiny_pipeline(remote_model, qa_file, tmp_path / "root")))
    one_line_error(capsys, ["pipeline", "--file", str(f)], "auto_map", "model.trust_remote_code=true")
    assert not (tmp_path / "marker").exists() and not (tmp_path / "root" / "stage1").exists()


def test_the_opt_in_is_a_recorded_setting(remote_model, qa_file, tmp_path):
    assert "auto_map" in model_dir_problem(remote_model)
    assert model_dir_problem(remote_model, trusted=True) is None
    cfg = resolve("tiny_cmas_rl", [f"model.path={remote_model}", f"data.train={qa_file}", "model.trust_remote_code=true",
                                   f"trainer.out_dir={tmp_path / 'run'}"])
    assert run_identity(cfg)["config"]["model.trust_remote_code"] is True
    trust_remote_code(cfg.model.trust_remote_code)
    assert remote_code_trusted() and model_dir_problem(remote_model) is None
    assert not (tmp_path / "marker").exists()
