"""No silent bundled corpus, and what a run records of its retriever."""

import json
import shutil

import pytest

from mopd.config import RetrieverConfig, resolve
from mopd.retriever import (
    IndexDirError,
    NoRetriever,
    index_fingerprint,
    load_retriever,
    open_retriever,
    retriever_identity,
)
from mopd.retriever.bundled import BUNDLED_CORPUS
from mopd.retriever.identity import bundled_fingerprint
from mopd.retriever.server import ServerThread


def test_no_index_is_refused_naming_both_settings_and_bundled_must_be_asked_for(monkeypatch):
    import mopd.retriever.bundled as bundled

    built = []
    monkeypatch.setattr(bundled, "bundled_index", lambda *a, **k: built.append(1))
    for cfg in (RetrieverConfig(), RetrieverConfig(kind="inprocess", index="  ")):
        with pytest.raises(NoRetriever) as e:
            load_retriever(cfg)
        assert "retriever.index" in str(e.value) and "retriever.url" in str(e.value) and "\n" not in str(e.value)
        with pytest.raises(NoRetriever):
            retriever_identity(cfg)
    assert built == []                                    # the bundled index was never built as a fallback
    assert resolve("cmas_rl").retriever.index == "" and resolve("mopd").retriever.index == ""
    assert {resolve(p).retriever.index for p in ("tiny_cmas_rl", "tiny_mopd", "tiny_base_teacher")} == {"bundled"}


def test_bundled_identity_is_the_corpus_content_without_building_it(tmp_path, monkeypatch):
    ident = retriever_identity(RetrieverConfig(index="bundled"))
    assert ident == {"kind": "inprocess", "index": "bundled", "fingerprint": bundled_fingerprint()}
    copy = tmp_path / "bundled.jsonl"
    data = BUNDLED_CORPUS.read_bytes()
    copy.write_bytes(data[:-2] + b"X\n")                  # one byte of the last passage differs
    import mopd.retriever.identity as identity

    monkeypatch.setattr(identity, "BUNDLED_CORPUS", copy)
    assert bundled_fingerprint() != ident["fingerprint"]


def test_index_fingerprint_follows_the_contents_not_the_path_or_build_time(built, tmp_path):
    src = built("bm25")
    a = tmp_path / "a"
    shutil.copytree(src, a)
    first = index_fingerprint(a)
    assert len(first) == 32 and first == index_fingerprint(src)        # moved: the same index
    meta = json.loads((a / "meta.json").read_text())
    (a / "meta.json").write_text(json.dumps(dict(meta, created="1999-01-01T00:00:00")))
    assert index_fingerprint(a) == first                               # rebuilt identically: the same
    (a / "meta.json").write_text(json.dumps(dict(meta, num_passages=meta["num_passages"] - 1)))
    assert index_fingerprint(a) != first
    (a / "meta.json").write_text(json.dumps(meta))
    data = sorted(p for p in (a / "bm25").rglob("*") if p.is_file())[0]
    raw = bytearray(data.read_bytes())
    raw[0] ^= 1
    data.write_bytes(bytes(raw))
    assert index_fingerprint(a) != first                               # an index file changed
    flat = index_fingerprint(built("flat"))
    assert flat not in (first, index_fingerprint(src))


def test_an_index_directory_is_recorded_resolved_with_its_fingerprint(built, tmp_path, monkeypatch):
    monkeypatch.chdir(built("bm25").parent)
    ident = retriever_identity(RetrieverConfig(index="bm25"))
    assert ident == {"kind": "inprocess", "index": str(built("bm25").resolve()),
                     "fingerprint": index_fingerprint(built("bm25"))}
    with pytest.raises(IndexDirError, match="meta.json"):
        retriever_identity(RetrieverConfig(index=str(tmp_path / "nowhere")))
    assert open_retriever(built("bm25")).fingerprint == ident["fingerprint"]


def test_a_server_reports_its_index_fingerprint_and_the_client_reads_it(built):
    from mopd.retriever import HttpRetriever

    local = open_retriever(built("bm25"))
    with ServerThread(local) as srv:
        client = HttpRetriever(srv.url + "/retrieve", retries=0)
        assert client.index_fingerprint() == index_fingerprint(built("bm25"))
        ident = retriever_identity(RetrieverConfig(kind="http", url=srv.url + "/retrieve"))
    assert ident == {"kind": "http", "url": srv.url, "fingerprint": index_fingerprint(built("bm25"))}
    # a server that reports none (Search-R1's own) is recorded as such
    assert retriever_identity(RetrieverConfig(kind="http", url="http://h:1"), health={"status": "ok"}) == \
        {"kind": "http", "url": "http://h:1", "fingerprint": None}
