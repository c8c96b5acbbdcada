import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mopd.retriever.corpus import Corpus, CorpusError, corpus_fingerprint, line_starts


def _reference_starts(data: bytes):
    out, pos = [], 0
    for line in data.split(b"\n"):
        if line.strip():
            out.append(pos)
        pos += len(line) + 1
    return out


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(st.sampled_from([b"", b"  ", b"\r", b"a", b"{}", b"xyz" * 5, b" q "]), max_size=30),
       trailing=st.booleans(), block=st.integers(1, 17))
def test_line_starts_matches_reference(tmp_path_factory, lines, trailing, block):
    data = b"\n".join(lines) + (b"\n" if trailing else b"")
    p = tmp_path_factory.mktemp("ls") / "f.txt"
    p.write_bytes(data)
    if not data:
        return
    assert line_starts(p, block=block).tolist() == _reference_starts(data)


def test_rows_fetched_by_offset_equal_json_lines(tmp_path):
    rng = np.random.default_rng(3)
    rows = [{"id": f"d{i}", "contents": f"T{i}\n" + "w" * int(rng.integers(0, 300)) + " é ü"} for i in range(257)]
    p = tmp_path / "c.jsonl"
    # blank lines between rows do not count as rows
    p.write_text("".join(json.dumps(r, ensure_ascii=False) + ("\n\n" if i % 50 == 0 else "\n")
                         for i, r in enumerate(rows)))
    c = Corpus(p, cache_dir=tmp_path / "cache")
    assert len(c) == len(rows)
    for i in [0, 1, 50, 51, 128, 256]:
        assert c.document(i) == rows[i]
        assert c.passage(i, 2.0).contents == rows[i]["contents"]
    assert list(c.iter_contents(250)) == [r["contents"] for r in rows[250:]]
    assert c.contents([3, 1]) == [rows[3]["contents"], rows[1]["contents"]]
    with pytest.raises(IndexError):
        c.document(len(rows))


def test_offsets_cached_and_reused(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text('{"id": 1, "contents": "a\\nb"}\n{"id": 2, "title": "T", "text": "body"}\n')
    c1 = Corpus(p, cache_dir=tmp_path / "cache")
    assert c1.offsets_path.is_file()
    mtime = c1.offsets_path.stat().st_mtime_ns
    c2 = Corpus(p, cache_dir=tmp_path / "cache")
    assert c2.offsets_path == c1.offsets_path and c2.offsets_path.stat().st_mtime_ns == mtime
    assert c2.document(1) == {"id": "2", "contents": "T\nbody"}  # title/text rows are accepted


def test_fingerprint_tracks_content(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    big = os.urandom(5 << 20)  # above the whole-file threshold: sampled blocks
    a.write_bytes(big)
    b.write_bytes(big)
    assert corpus_fingerprint(a) == corpus_fingerprint(b)
    b.write_bytes(big[:-1] + bytes([big[-1] ^ 1]))  # last byte lies in the last sampled block
    assert corpus_fingerprint(a) != corpus_fingerprint(b)
    a.write_bytes(b"small")
    b.write_bytes(b"smalL")
    assert corpus_fingerprint(a) != corpus_fingerprint(b)


def test_bad_corpora_name_file_and_row(tmp_path):
    with pytest.raises(CorpusError, match="does not exist"):
        Corpus(tmp_path / "missing.jsonl")
    e = tmp_path / "empty.jsonl"
    e.write_text("")
    with pytest.raises(CorpusError, match="empty"):
        Corpus(e)
    g = tmp_path / "c.jsonl.gz"
    g.write_bytes(b"\x1f\x8b")
    with pytest.raises(CorpusError, match="gzip"):
        Corpus(g)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 0, "contents": "a\\nb"}\nnot json\n{"id": 2}\n')
    c = Corpus(bad, cache_dir=tmp_path)
    with pytest.raises(CorpusError, match="row 1: not valid JSON"):
        c.document(1)
    with pytest.raises(CorpusError, match="row 2: needs a string field 'contents'"):
        c.document(2)
    first_bad = tmp_path / "bad0.jsonl"
    first_bad.write_text("[1, 2]\n")
    with pytest.raises(CorpusError, match="row 0"):
        Corpus(first_bad, cache_dir=tmp_path)
