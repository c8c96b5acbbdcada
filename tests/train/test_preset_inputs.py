"""What a training preset does with the inputs given to it on the command line: an empty
``data.dev=`` means no dev set, and a tiny_* preset given a larger model says its learning rate is
the tiny model's."""

import json

import pytest

from mopd.cli import main
from mopd.config import resolve
from mopd.train.trainer import PolicyTrainer
from tests.helpers.retrievers import FakeRetriever
from tests.helpers.training import tiny_overrides

PRESET_LR = resolve("tiny_cmas_rl").trainer.lr
TINY_LINE = f"the tiny_* presets' learning rates (here trainer.lr={PRESET_LR:g}) are for the tiny world's 0.7M-parameter model"


@pytest.mark.parametrize("spelling", [["data.dev="], ["--data.dev="], ["--data.dev", ""]])
def test_an_empty_dev_set_on_the_command_line_means_none(spelling, capsys):
    assert resolve("tiny_cmas_rl", ["data.dev=somewhere.jsonl", *spelling]).data.dev == ""
    assert main(["config", "show", "tiny_cmas_rl", *spelling]) == 0
    assert "dev: ''" in capsys.readouterr().out


def test_empty_keeps_null_for_optional_fields_and_refuses_numbers():
    from mopd.config import ConfigError

    assert resolve("cmas_rl", ["model.activation_checkpointing=true", "model.activation_checkpointing="]
                   ).model.activation_checkpointing is None
    with pytest.raises(ConfigError, match="trainer.lr"):
        resolve("cmas_rl", ["trainer.lr="])


def test_a_run_without_a_dev_set_trains_and_never_validates(tiny_model_dir, qa_file, tmp_path, capsys):
    cfg = resolve("cmas_rl", tiny_overrides(tiny_model_dir, qa_file, tmp_path / "run", **{"trainer.val_every": 1}) +
                  ["data.dev="])
    t = PolicyTrainer(cfg, retriever=FakeRetriever(), progress=False)
    t.fit(1)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1] and not any(k.startswith("val/") for k in rows[0])
    assert "validation" not in capsys.readouterr().err


def _tiny_preset_trainer(model_dir, qa_file, out, **extra):
    cfg = resolve("tiny_cmas_rl", tiny_overrides(model_dir, qa_file, out, **{"trainer.lr": PRESET_LR, **extra}))
    return PolicyTrainer(cfg, retriever=FakeRetriever(), progress=False)


def test_a_tiny_preset_with_a_larger_model_says_whose_learning_rate_it_has(tiny_model_dir, qa_file, tmp_path,
                                                                           capsys):
    from tests.helpers.tiny_model import init_tiny_model

    # three layers where the tiny world's model has two (the hidden size is smaller than its 128)
    deeper = str(init_tiny_model(tmp_path / "deeper", vocab_size=400, hidden=32, layers=3, heads=2, ffn=64))
    _tiny_preset_trainer(deeper, qa_file, tmp_path / "a")
    err = [x for x in capsys.readouterr().err.splitlines() if "tiny" in x]
    assert len(err) == 1 and err[0].startswith(f"mopd: tiny_cmas_rl: {TINY_LINE}, and {deeper} has "), err
    assert "3 layers" in err[0] and "trainer.lr" in err[0]
    events = [json.loads(x) for x in (tmp_path / "a" / "events.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in events].count("tiny_preset") == 1


def test_a_tiny_preset_with_a_tiny_model_or_its_own_lr_says_nothing(tiny_model_dir, qa_file, tmp_path, capsys):
    from tests.helpers.tiny_model import init_tiny_model

    _tiny_preset_trainer(tiny_model_dir, qa_file, tmp_path / "a")          # hidden 32, 1 layer
    wider = str(init_tiny_model(tmp_path / "wider", vocab_size=400, hidden=192, layers=1, heads=2, ffn=64))
    _tiny_preset_trainer(wider, qa_file, tmp_path / "b", **{"trainer.lr": 1e-6})   # its lr is set
    # the same model under a preset that is not a tiny one
    PolicyTrainer(resolve("cmas_rl", tiny_overrides(wider, qa_file, tmp_path / "c")), retriever=FakeRetriever(),
                  progress=False)
    assert "0.7M" not in capsys.readouterr().err
    _tiny_preset_trainer(wider, qa_file, tmp_path / "d")                   # and the line, to be sure
    assert TINY_LINE in capsys.readouterr().err
