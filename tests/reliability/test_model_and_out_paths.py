"""Model directories that cannot be loaded and output paths that cannot be written are refused
with one line before anything loads or is written (`--model RUN`, a model without a
usable tokenizer, an unknown architecture, `--out FILE`, `trainer.out_dir=FILE/run`, `--file DIR`)."""

import json
import os
import shutil

import pytest

from tests.helpers.cli import one_line_error




@pytest.fixture()
def broken_model(tiny_model_dir, tmp_path):
    """A copy of the tiny model to damage."""
    d = tmp_path / "model"
    shutil.copytree(tiny_model_dir, d)
    return d


def _eval(model, qa_file, out):
    return ["eval", "run", "--model", str(model), "--workflow", "cmas", "--manifest", qa_file, "--out", str(out)]


def _train(model, qa_file, out, *extra):
    return ["train", "tiny_cmas_rl", f"model.path={model}", f"data.train={qa_file}", f"trainer.out_dir={out}", *extra]


def _damage(model, how):
    if how == "no tokenizer files":
        for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            (model / f).unlink()
    elif how == "only tokenizer.json removed":
        (model / "tokenizer.json").unlink()
    else:
        conf = json.loads((model / "config.json").read_text())
        conf["model_type"] = "qwen9_turbo"
        (model / "config.json").write_text(json.dumps(conf))


CASES = [("no tokenizer files", "has no usable tokenizer"), ("only tokenizer.json removed", "has no usable tokenizer"),
         ("unknown model_type", "model_type 'qwen9_turbo'")]


@pytest.mark.parametrize("how,message", CASES)
def test_eval_refuses_a_model_it_cannot_load(broken_model, qa_file, tmp_path, capsys, how, message):
    _damage(broken_model, how)
    one_line_error(capsys, _eval(broken_model, qa_file, tmp_path / "ev"), message)
    assert not (tmp_path / "ev").exists()


@pytest.mark.parametrize("how,message", CASES)
def test_train_refuses_a_model_it_cannot_load_and_writes_nothing(broken_model, qa_file, tmp_path, capsys, how,
                                                                message):
    _damage(broken_model, how)
    one_line_error(capsys, _train(broken_model, qa_file, tmp_path / "run"), "model.path=", message)
    assert not (tmp_path / "run").exists()      # no run.json left behind to refuse the corrected rerun


def test_a_run_directory_as_model_says_to_export_it(tiny_model_dir, qa_file, tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoints" / "step_000001").mkdir(parents=True)
    (run / "run.json").write_text("{}")
    hint = "this is a run directory; export it with `mopd export RUN --out DIR`"
    one_line_error(capsys, _eval(run, qa_file, tmp_path / "ev"), f"--model {run}: {hint}")
    one_line_error(capsys, _train(run, qa_file, tmp_path / "r2"), f"model.path={run}: {hint}")


def test_eval_out_that_is_a_file_is_refused_before_the_model_loads(tiny_model_dir, qa_file, tmp_path, capsys,
                                                                   monkeypatch):
    import mopd.rollout.engines as engine

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before --out was checked")

    monkeypatch.setattr(engine, "build_engine", no_load)
    f = tmp_path / "results"
    f.write_text("user data\n")
    one_line_error(capsys, _eval(tiny_model_dir, qa_file, f), f"--out {f} is a file")
    one_line_error(capsys, _eval(tiny_model_dir, qa_file, f / "sub"), f"is under {f}, which is a file")
    assert f.read_text() == "user data\n"


@pytest.mark.parametrize("where", ["file", "under a file"])
def test_train_out_dir_that_is_or_is_under_a_file(tiny_model_dir, qa_file, tmp_path, capsys, where):
    f = tmp_path / "notes.txt"
    f.write_text("keep me\n")
    out = f if where == "file" else f / "run"
    one_line_error(capsys, _train(tiny_model_dir, qa_file, out), f"trainer.out_dir={out}")
    assert f.read_text() == "keep me\n"


def test_read_only_run_directory_is_refused_before_training(tiny_model_dir, qa_file, tmp_path, capsys, monkeypatch):
    # The tests run as root, which writes through permission bits, so chmod alone cannot make a
    # read-only directory here: the check asks os.access, which is what is simulated.
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **k: False if str(p).endswith("checkpoints")
                        else real(p, mode, **k))
    one_line_error(capsys, _train(tiny_model_dir, qa_file, out), f"{out / 'checkpoints'} is read-only")
    assert sorted(os.listdir(out)) == ["checkpoints"]


def test_file_that_is_a_directory_says_so(tmp_path, capsys):
    one_line_error(capsys, ["config", "show", "--file", str(tmp_path), "tiny_cmas_rl"], "is a directory")
