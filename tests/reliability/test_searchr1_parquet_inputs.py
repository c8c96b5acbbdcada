"""Search-R1 parquet files that are not quite the layout are checked like JSONL: a gold
answer that is a mapping or a number is refused naming the row and field (taking a mapping's keys
made every score on the split wrong), a prompt whose content is not a string is one line naming
the row (it was a TypeError traceback), and a file without ``data_source`` is one line (it was
pyarrow's schema dump)."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mopd.cli import main


def _row(i, target=None, content=None):
    return {"id": f"nq_{i}", "data_source": "nq",
            "prompt": [{"role": "user", "content": content if content is not None else f"Question: who is {i}?"}],
            "reward_model": {"ground_truth": {"target": target if target is not None else [f"gold {i}"]},
                             "style": "rule"}}


ARGS = ["--train-datasets", "nq", "--test-counts", "nq=2", "--dev-counts", "nq=1"]


def _write(root, table):
    """``table`` as the training split, and a good test split beside it."""
    root.mkdir()
    pq.write_table(table, root / "train.parquet")
    pq.write_table(pa.Table.from_pylist([_row(i) for i in range(100, 106)]), root / "test.parquet")


def _prepare(capsys, rows, tmp_path):
    _write(tmp_path / "src", pa.Table.from_pylist(rows))
    rc = main(["data", "prepare", str(tmp_path / "src"), "--out", str(tmp_path / "out"), *ARGS])
    cap = capsys.readouterr()
    return rc, cap.err.strip()


def _one_line(rc, err):
    """The error is the one line after the progress lines ("reading FILE ...")."""
    assert rc == 2 and "Traceback" not in err, err
    progress, _, err = err.rpartition("\n")
    assert all(line.startswith("reading ") for line in progress.splitlines()), progress
    assert err.startswith("mopd data: error: ") or err.startswith("mopd data prepare: error: "), err
    return err


TARGETS = {"mapping": (lambda i: {"first": f"gold {i}", "second": "x"}, "dict"),   # the keys were taken
           "number": (lambda i: 1900 + i, "int"), "list of numbers": (lambda i: [1900 + i], "int")}


@pytest.mark.parametrize("kind", list(TARGETS))
def test_a_gold_answer_that_is_not_strings_is_refused_naming_row_and_field(tmp_path, capsys, kind):
    target, shown = TARGETS[kind]          # a parquet column holds one type: every row's target is one
    err = _one_line(*_prepare(capsys, [_row(i, target=target(i)) for i in range(6)], tmp_path))
    assert "row 0" in err and "reward_model.ground_truth.target" in err and shown in err, err
    assert not (tmp_path / "out").exists()


def test_a_prompt_whose_content_is_not_a_string_is_one_line(tmp_path, capsys):
    rows = [_row(i, content=str(i)) for i in range(6)]
    table = pa.Table.from_pylist([{**r, "prompt": [{"role": "user", "content": i}]} for i, r in enumerate(rows)])
    _write(tmp_path / "src", table)
    rc = main(["data", "prepare", str(tmp_path / "src"), "--out", str(tmp_path / "out"), *ARGS])
    err = _one_line(rc, capsys.readouterr().err.strip())
    assert "row 0" in err and "content must be a string" in err and "int" in err, err


def test_a_file_without_data_source_is_one_line(tmp_path, capsys):
    rows = [{k: v for k, v in _row(i).items() if k != "data_source"} for i in range(6)]
    err = _one_line(*_prepare(capsys, rows, tmp_path))
    assert "no 'data_source' column" in err and "prompt" in err, err
