"""What a training preset does with the inputs given to it on the command line: an empty
``data.dev=`` means no dev set (issue 37)."""

import json

import pytest

from mopd.cli import main
from mopd.config import resolve
from mopd.train.trainer import PolicyTrainer
from tests.helpers.retrievers import FakeRetriever
from tests.helpers.training import tiny_overrides

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
