"""The one atomic-write helper: the target is replaced whole or not at all."""

import json
import os

import pytest

from mopd.core.atomic import atomic_open, atomic_write_bytes, atomic_write_json, atomic_write_text, temporary_path


def test_a_write_replaces_the_whole_file_and_leaves_no_temporary(tmp_path):
    p = tmp_path / "state.json"
    p.write_text("old")
    atomic_write_json(p, {"step": 7, "names": ["Norwick", "Lorbury"]}, indent=None)
    assert json.loads(p.read_text()) == {"step": 7, "names": ["Norwick", "Lorbury"]}
    assert p.read_text().endswith("\n") and sorted(x.name for x in tmp_path.iterdir()) == ["state.json"]
    data = os.urandom(1531)
    atomic_write_bytes(p, data, fsync=True)
    assert p.read_bytes() == data
    atomic_write_text(p, "åäö\n")
    assert p.read_text(encoding="utf-8") == "åäö\n"


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    p = tmp_path / "records.jsonl"
    p.write_text("line 1\nline 2\n")
    with pytest.raises(RuntimeError, match="disk"):
        with atomic_open(p) as f:
            f.write("half of a new file")
            assert temporary_path(p).is_file()
            raise RuntimeError("disk went away")
    assert p.read_text() == "line 1\nline 2\n"
    assert not temporary_path(p).exists() and sorted(x.name for x in tmp_path.iterdir()) == ["records.jsonl"]


def test_only_whole_file_modes():
    with pytest.raises(ValueError, match="whole file"):
        with atomic_open("x", "a"):
            pass
