"""`mopd rollout` refuses a directory as --out and --limit 0 before running anything."""

import pytest

from mopd.cli import main


@pytest.mark.parametrize("extra,message", [(["--limit", "0"], "--limit 0: must be >= 1"),
                                           (["--limit", "-3"], "--limit -3: must be >= 1")])
def test_limit_below_one(tmp_path, capsys, extra, message):
    data = tmp_path / "q.jsonl"
    data.write_text('{"id": "q1", "question": "Q?", "golden_answers": ["b"]}\n')
    rc = main(["rollout", "--model", str(tmp_path), "--data", str(data), "--out", str(tmp_path / "r.jsonl"), *extra])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message in err and "\n" not in err


def test_out_is_an_existing_directory(tmp_path, capsys):
    data = tmp_path / "q.jsonl"
    data.write_text('{"id": "q1", "question": "Q?", "golden_answers": ["b"]}\n')
    out = tmp_path / "existing"
    out.mkdir()
    rc = main(["rollout", "--model", str(tmp_path), "--data", str(data), "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "is a directory; give the records file" in err and "\n" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing", "q.jsonl"]   # no stray existing.tmp
