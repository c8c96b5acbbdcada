"""`mopd score` and `mopd eval report` on bad inputs: one line, exit 2, no traceback."""

import pytest

from mopd.cli import main
from mopd.core.records import write_records
from tests.helpers.eval_records import make_record, right


def _err(capsys):
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and "\n" not in err, err
    return err


def _records(path, answers=("paris",), qids=("q1", "q2")):
    path.parent.mkdir(parents=True, exist_ok=True)
    write_records(path, [make_record(q, "nq", a, right(), answers=answers) for q in qids for a in range(2)])
    return path


def test_score_records_directory(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    assert main(["score", "--records", str(tmp_path / "run")]) == 2
    assert "is a directory; pass a records file" in _err(capsys)


@pytest.mark.parametrize("command", [["score", "--records"], ["eval", "report", "--no-plots", "--out", "OUT"]])
def test_non_utf8_records_file(tmp_path, capsys, command):
    bad = tmp_path / "records.jsonl"
    bad.write_bytes(_records(tmp_path / "x.jsonl").read_bytes() + b'{"question": "caf\xe9"}\n')
    argv = [c.replace("OUT", str(tmp_path / "rep")) for c in command] + [str(bad)]
    assert main(argv) == 2
    assert "records.jsonl:5: not UTF-8 text" in _err(capsys)


def test_report_refuses_same_question_ids_with_other_gold_answers(tmp_path, capsys):
    a = _records(tmp_path / "a" / "records.jsonl", answers=("paris",)).parent
    b = _records(tmp_path / "b" / "records.jsonl", answers=("lyon",)).parent
    same = _records(tmp_path / "c" / "records.jsonl", answers=("paris", "paris")).parent
    assert main(["eval", "report", str(a), str(b), "--out", str(tmp_path / "r"), "--no-plots"]) == 2
    err = _err(capsys)
    assert "question nq/q1 has gold answers ['lyon'] in system 'b'" in err and "different test files" in err
    assert main(["eval", "report", str(a), str(b), "--intersect", "--out", str(tmp_path / "r"), "--no-plots"]) == 2
    assert main(["eval", "report", str(a), str(same), "--out", str(tmp_path / "r"), "--no-plots",
                 "--draws", "20"]) == 0
