"""Sizes checked against the data they draw from, and paths no file system can hold, each one line
before anything loads: ``trainer.questions_per_step=10**23`` with 8 questions (before: a minute of
silence while the step's index list grew), a 300-byte file name or a 5,000-byte path in
``model.path``, ``trainer.out_dir`` or ``retriever.index`` (before: an ``OSError`` traceback)."""

import dataclasses

import pytest

import mopd.train.trainer
from mopd.cli import main
from mopd.config import ConfigError, resolve
from mopd.train.preflight import PreflightError, check_step_size


@pytest.fixture()
def no_model(monkeypatch):
    monkeypatch.setattr(mopd.train.trainer.PolicyTrainer, "__init__", lambda *a, **k: pytest.fail("a model loaded"))


def _train(capsys, *overrides):
    rc = main(["train", "tiny_cmas_rl", *overrides])
    return rc, capsys.readouterr().err.strip()


@pytest.mark.parametrize("per_step", [10 ** 23, 17, 2 ** 31])
def test_a_step_larger_than_the_data_allows_is_one_line(tmp_path, capsys, tiny_model_dir, qa_file, no_model, per_step):
    out = tmp_path / "run"
    rc, err = _train(capsys, f"model.path={tiny_model_dir}", f"data.train={qa_file}", f"trainer.out_dir={out}",
                     f"trainer.questions_per_step={per_step}", "retriever.index=bundled")
    assert rc == 2 and "\n" not in err and "Traceback" not in err, err
    assert f"trainer.questions_per_step={per_step} but data.train={qa_file} holds 8 questions" in err
    assert not out.exists()


def test_step_size_by_hand():
    check_step_size(16, 8, "f")          # an epoch and the next one within a step: some questions twice
    check_step_size(1, 1, "f")
    with pytest.raises(PreflightError, match="set trainer.questions_per_step=3 or less"):
        check_step_size(7, 3, "f")


LONG_NAME = "n" * 300


@pytest.mark.parametrize("key", ["model.path", "trainer.out_dir", "retriever.index", "data.train", "teacher.path",
                                 "retriever.token_file"])
@pytest.mark.parametrize("how", ["a long name", "a long path"])
def test_a_path_no_file_system_can_hold_is_one_line(tmp_path, capsys, tiny_model_dir, qa_file, no_model, key, how):
    bad = f"{tmp_path}/{LONG_NAME}/x" if how == "a long name" else str(tmp_path) + "/abcdefgh" * 700
    settings = {"model.path": tiny_model_dir, "data.train": qa_file, "trainer.out_dir": str(tmp_path / "run"),
                "retriever.index": "bundled", key: bad}
    rc, err = _train(capsys, *[f"{k}={v}" for k, v in settings.items()])
    assert rc == 2 and "\n" not in err and "Traceback" not in err, err
    said = "... in the path is 300 bytes long" if how == "a long name" else f"the path is {len(bad.encode())} bytes long"
    assert err.startswith(f"mopd train: error: {key}: ") and said in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("section,field", [("model", "path"), ("trainer", "out_dir"), ("data", "dev")])
def test_a_nul_in_a_path_setting_is_refused(section, field):
    cfg = resolve("tiny_cmas_rl")           # a command line cannot carry a NUL; a YAML file or a preset can
    with pytest.raises(ConfigError, match=f"^{section}.{field}: the path holds a NUL byte"):
        dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **{field: "a\0b"})})
