"""Inputs that used to pass and go wrong later: a gold answer that normalises to
nothing (it pays full exact match for an article or an empty answer) and NaN or infinite config
floats (they pass every range comparison, then fail inside AdamW or the loss kernel)."""

import json

import pytest

from mopd.cli import main
from mopd.config import ConfigError, role_key, resolve
from mopd.core.qa import DataError, load_questions
from mopd.core.scoring import exact_match, extract_answer


@pytest.mark.parametrize("gold", ["", "   ", "the", " An ", ".", "A"])
def test_an_empty_gold_answer_is_dropped_and_a_row_with_only_empty_ones_refused(tmp_path, gold):
    """One empty alias (FlashRAG has rows like ["A", ...]) drops that alias, counted, not
    the row; a row whose every alias is empty is refused with its line and id."""
    assert exact_match(extract_answer("<answer>the</answer>"), [gold]) == 1.0     # what it would pay
    f = tmp_path / "train.jsonl"
    rows = [{"id": "ok1", "question": "Q1?", "golden_answers": ["Paris"]},
            {"id": "two9", "question": "Q2?", "golden_answers": [gold, "Rome", gold]},
            {"id": "bad7", "question": "Q3?", "golden_answers": [gold]}]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError) as e:
        load_questions(f)
    msg = str(e.value)
    assert f"{f}:3" in msg and "id bad7" in msg and "golden_answers" in msg and "\n" not in msg
    kept, report = load_questions(f, skip_malformed=True)
    assert [(q.id, q.answers) for q in kept] == [("ok1", ["Paris"]), ("two9", ["Rome"])]
    assert report.skipped == 1 and report.aliases_dropped == 2
    assert report.alias_notes == [f"{f}:2 (id two9): golden_answers[0] {gold!r}",
                                  f"{f}:2 (id two9): golden_answers[2] {gold!r}"]


def test_searchr1_rows_with_an_empty_target_are_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"id": "7", "data_source": "nq", "question": "Who?", "reward_model": {"ground_truth": {"target": [" "]}}}]
    f = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), f)
    with pytest.raises(DataError, match=r"row 0 \(id nq_7\).*target is \[' '\], every answer empty"):
        load_questions(f)


def test_train_refuses_the_file_in_one_line(tiny_model_dir, tmp_path, capsys):
    f = tmp_path / "train.jsonl"
    f.write_text(json.dumps({"id": "q0", "question": "Where?", "golden_answers": [""]}) + "\n")
    rc = main(["train", "tiny_cmas_rl", f"model.path={tiny_model_dir}", f"data.train={f}",
               f"trainer.out_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "empty after answer normalisation" in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("override", ["trainer.lr=nan", "rollout.temperature=nan", "trainer.lr=inf",
                                      "algo.searcher.opd_coef=inf", "eval.top_p=NaN"])
def test_non_finite_config_floats_are_refused(override, capsys):
    with pytest.raises(ConfigError, match="must be a finite number|must be"):
        resolve("tiny_cmas_rl", [override])
    assert main(["config", "show", "tiny_cmas_rl", override]) == 2
    err = capsys.readouterr().err.strip()
    key = role_key(override.split("=")[0])       # algo.searcher.x is named as algo.roles.searcher.x
    assert err.startswith("mopd config: error: ") and key in err and "\n" not in err, err


def test_yaml_nan_is_refused(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("trainer:\n  lr: .nan\n")
    with pytest.raises(ConfigError, match="trainer.lr=nan must be a finite number"):
        resolve("tiny_cmas_rl", None, str(y))
