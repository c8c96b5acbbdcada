"""`mopd data build-splits` refuses an empty training pool or an empty split, writing nothing."""

import json

from mopd.cli import main


def _qa(path, n, prefix):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": f"{prefix}{i}", "question": f"{prefix} question {i}?",
                                        "golden_answers": ["x"]}) + "\n" for i in range(n)))
    return str(path)


def _run(capsys, *argv):
    rc = main(["data", "build-splits", *argv])
    return rc, capsys.readouterr().err.strip()


def test_empty_training_pool(tmp_path, capsys):
    rc, err = _run(capsys, "--train", _qa(tmp_path / "nq" / "train.jsonl", 0, "t"),
                   "--test", _qa(tmp_path / "nq" / "test.jsonl", 3, "s"), "--out", str(tmp_path / "out"))
    assert rc == 2 and "the training pool is empty" in err and "\n" not in err
    assert not (tmp_path / "out").exists()


def test_dev_taking_every_training_question(tmp_path, capsys):
    rc, err = _run(capsys, "--train", _qa(tmp_path / "nq" / "train.jsonl", 4, "t"),
                   "--test", _qa(tmp_path / "nq" / "test.jsonl", 3, "s"), "--dev-counts", "nq=4",
                   "--out", str(tmp_path / "out"))
    assert rc == 2 and "the train split would be empty (train 0, dev 4" in err and "nothing was written" in err
    assert not (tmp_path / "out").exists()
