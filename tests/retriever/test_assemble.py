"""`mopd retriever assemble`: Search-R1's wiki-18 layout, index parts and a gzipped corpus."""

import gzip
import hashlib
import json
import os

import numpy as np
import pytest

from mopd.cli import main

faiss = pytest.importorskip("faiss")

DIM = 384        # MiniLM's, so the assembled files also import


def _letters(i):
    return "abcdefghijklmnopqrstuvwxyz"[i // 26] + "abcdefghijklmnopqrstuvwxyz"[i % 26]


def make_layout(folder, n=301, part_bytes=13001, seed=0, rows=None):
    """A flat inner-product index of ``n`` random unit vectors split like ``split -b`` into part_aa,
    part_ab, ... (more than 26 parts: the names roll over to part_ba), and wiki-18.jsonl.gz."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, DIM)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    index = faiss.IndexFlatIP(DIM)
    index.add(x)
    whole = faiss.serialize_index(index).tobytes()
    folder.mkdir(parents=True, exist_ok=True)
    parts = [whole[i:i + part_bytes] for i in range(0, len(whole), part_bytes)]
    for i, chunk in enumerate(parts):
        (folder / f"part_{_letters(i)}").write_bytes(chunk)
    lines = "".join(json.dumps({"id": str(i), "contents": f"Title {i}\nrandom passage {rng.integers(1e9)}"}) + "\n"
                    for i in range(n if rows is None else rows))
    with gzip.open(folder / "wiki-18.jsonl.gz", "wb") as f:
        f.write(lines.encode())
    return whole, x, lines, len(parts)


def _run(capsys, *argv):
    rc = main(["retriever", "assemble", *map(str, argv)])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err.strip().splitlines()[-1] if cap.err.strip() else ""


def test_assembles_parts_in_order_and_decompresses_the_corpus(tmp_path, capsys):
    whole, x, lines, n_parts = make_layout(tmp_path / "wiki18")
    assert n_parts > 26                                        # part_aa .. part_bj
    rc, out, err = _run(capsys, tmp_path / "wiki18")
    assert rc == 0, err
    index_file, corpus = tmp_path / "wiki18" / "e5_Flat.index", tmp_path / "wiki18" / "wiki-18.jsonl"
    assert index_file.read_bytes() == whole and corpus.read_text() == lines
    assert (tmp_path / "wiki18" / "wiki-18.jsonl.gz").is_file()            # kept, unlike gzip -d
    assert "301 vectors" in out and "301 rows" in out and "next: mopd retriever import-index" in out
    q = np.random.default_rng(1).standard_normal((5, DIM)).astype(np.float32)
    got = faiss.read_index(str(index_file)).search(q, 4)[1]
    np.testing.assert_array_equal(got, np.argsort(-(q @ x.T), axis=1)[:, :4])
    # a rerun reuses both files without writing them
    before = {p: os.stat(p).st_mtime_ns for p in (index_file, corpus)}
    rc, out, _ = _run(capsys, tmp_path / "wiki18")
    assert rc == 0 and out.count("already assembled, reused") == 2
    assert {p: os.stat(p).st_mtime_ns for p in before} == before
    # and the result imports as an index directory
    from mopd.retriever.importer import import_index
    from mopd.retriever.index_store import read_meta

    meta = read_meta(import_index(corpus, index_file, tmp_path / "idx", encoder="minilm"))
    assert (meta.kind, meta.num_passages, meta.dim) == ("flat", 301, DIM)


def test_a_missing_part_is_named_and_nothing_is_written(tmp_path, capsys):
    make_layout(tmp_path / "w")
    (tmp_path / "w" / "part_ac").unlink()
    rc, _, err = _run(capsys, tmp_path / "w")
    assert rc == 2 and "part_ac is missing" in err
    assert sorted(p.name for p in (tmp_path / "w").iterdir() if not p.name.startswith("part_")) == ["wiki-18.jsonl.gz"]


@pytest.mark.parametrize("damage", ["truncate", "repeat"])
def test_a_truncated_or_repeated_part_fails_the_size_check(tmp_path, capsys, damage):
    _, _, _, n_parts = make_layout(tmp_path / "w")
    last = tmp_path / "w" / f"part_{_letters(n_parts - 1)}"
    if damage == "truncate":
        last.write_bytes(last.read_bytes()[:-7])
    else:
        last.write_bytes(last.read_bytes() + (tmp_path / "w" / "part_aa").read_bytes())
    rc, _, err = _run(capsys, tmp_path / "w", "--out", tmp_path / "out")
    assert rc == 2 and "the file is incomplete or has extra bytes" in err
    assert not (tmp_path / "out" / "e5_Flat.index").exists()
    assert not [p for p in (tmp_path / "out").iterdir() if ".tmp" in p.name]


def test_checksums_are_checked_while_copying(tmp_path, capsys):
    whole, _, lines, _ = make_layout(tmp_path / "w")
    w = tmp_path / "w"
    sums = tmp_path / "SHA256SUMS"
    digest = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    good = [f"{digest((w / 'part_ab').read_bytes())}  part_ab", f"{digest(whole)} *e5_Flat.index",
            f"{hashlib.md5((w / 'wiki-18.jsonl.gz').read_bytes()).hexdigest()}  wiki-18.jsonl.gz"]
    sums.write_text("\n".join(good) + "\n")
    rc, out, err = _run(capsys, w, "--out", tmp_path / "ok", "--checksums", sums)
    assert rc == 0, err
    assert "checksums match: part_ab, e5_Flat.index, wiki-18.jsonl.gz" in out
    bad = good[:]
    bad[0] = f"{digest(b'other')}  part_ab"
    sums.write_text("\n".join(bad) + "\n")
    rc, _, err = _run(capsys, w, "--out", tmp_path / "bad", "--checksums", sums)
    assert rc == 2 and err.startswith("mopd retriever: error: part_ab: sha256") and "download it again" in err
    assert not (tmp_path / "bad" / "e5_Flat.index").exists()
    sums.write_text("not a checksum line\n")
    rc, _, err = _run(capsys, w, "--out", tmp_path / "bad", "--checksums", sums)
    assert rc == 2 and "SHA256SUMS:1: not a 'HASH  NAME' line" in err


def test_files_it_did_not_write_are_never_overwritten(tmp_path, capsys):
    whole, _, _, _ = make_layout(tmp_path / "w")
    w = tmp_path / "w"
    (w / "e5_Flat.index").write_bytes(b"mine")
    rc, _, err = _run(capsys, w)
    assert rc == 2 and "was not written by `mopd retriever assemble`" in err
    assert (w / "e5_Flat.index").read_bytes() == b"mine"
    # assembled by hand with cat: adopted (size and header checked), not rewritten
    (w / "e5_Flat.index").write_bytes(whole)
    before = os.stat(w / "e5_Flat.index").st_mtime_ns
    (w / "wiki-18.jsonl").write_text("my own corpus\n")
    rc, _, err = _run(capsys, w)
    assert rc == 2 and "wiki-18.jsonl already exists" in err
    assert (w / "wiki-18.jsonl").read_text() == "my own corpus\n"
    (w / "wiki-18.jsonl").unlink()
    rc, out, err = _run(capsys, w)
    assert rc == 0, err
    assert "e5_Flat.index: already assembled, reused" in out and os.stat(w / "e5_Flat.index").st_mtime_ns == before


def test_corpus_and_index_from_different_builds_are_refused(tmp_path, capsys):
    make_layout(tmp_path / "w", rows=300)
    rc, _, err = _run(capsys, tmp_path / "w")
    assert rc == 2 and "holds 301 vectors but" in err and "has 300 lines" in err


def test_a_truncated_gzip_is_refused_and_leaves_no_corpus(tmp_path, capsys):
    make_layout(tmp_path / "w", n=2000, part_bytes=1 << 20)
    gz = tmp_path / "w" / "wiki-18.jsonl.gz"
    gz.write_bytes(gz.read_bytes()[:-100])
    rc, _, err = _run(capsys, tmp_path / "w")
    assert rc == 2 and "is not a complete gzip file" in err
    assert not (tmp_path / "w" / "wiki-18.jsonl").exists()
    assert not [p for p in (tmp_path / "w").iterdir() if ".tmp" in p.name]


def test_not_enough_disk_is_refused_before_writing(tmp_path, capsys, monkeypatch):
    import shutil
    from collections import namedtuple

    make_layout(tmp_path / "w")
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10 ** 12, 10 ** 12 - 1000, 1000))
    rc, _, err = _run(capsys, tmp_path / "w")
    assert rc == 2 and "needs 0.0 GB free" in err and "has 0.0 GB" in err
    assert not (tmp_path / "w" / "e5_Flat.index").exists()


def test_the_readme_gpu_steps_for_the_index_parse(tmp_path, capsys):
    """The GPU guide's retriever steps name options these commands have (parsed, not run)."""
    from mopd.cli import build_parser
    from tests.helpers.readme import gpu_section_commands

    steps = gpu_section_commands("retriever")
    assert [s[1] for s in steps] == ["assemble", "import-index", "serve"]
    parser = build_parser()
    for argv in steps:
        parser.parse_args(argv)                      # exits on an unknown option
    assert "--encoder-devices" in steps[2] and steps[1][steps[1].index("--faiss-index") + 1].endswith("e5_Flat.index")
