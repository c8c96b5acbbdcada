import json
import shutil

import numpy as np
import pytest

from mopd.config import RetrieverConfig
from mopd.retriever import (
    HttpRetriever,
    IndexDirError,
    IndexMismatch,
    IndexSpec,
    Retriever,
    build_index,
    load_retriever,
    open_retriever,
)
from mopd.retriever.encoders import Encoder
from mopd.retriever.index_faiss import flat_vectors

from .conftest import N_SMALL

PROBES = [0, 1, 39, 40, 41, 77, 150, N_SMALL - 1]


@pytest.mark.parametrize("kind", ["flat", "torch", "bm25"])
def test_known_item_retrieval_at_rank_1(built, bundled_rows, kind):
    r = open_retriever(built(kind))
    assert len(r) == N_SMALL
    queries = [bundled_rows[i]["contents"] for i in PROBES]
    results = r.search(queries, 3)
    assert [res[0].id for res in results] == [bundled_rows[i]["id"] for i in PROBES]
    for res in results:
        assert len(res) == 3 and res[0].score >= res[1].score >= res[2].score
    # the text alone (without its title) finds the passage too
    text_only = r.search([bundled_rows[i]["contents"].split("\n", 1)[1] for i in PROBES], 1)
    assert [res[0].id for res in text_only] == [bundled_rows[i]["id"] for i in PROBES]


def test_flat_and_torch_give_the_same_ranking(built, bundled_rows):
    qs = ["harbour town with copper market", "a poet born in a town", bundled_rows[5]["contents"][:40]]
    ids_f, s_f = open_retriever(built("flat")).search_rows(qs, 5)
    ids_t, s_t = open_retriever(built("torch")).search_rows(qs, 5)
    np.testing.assert_array_equal(ids_f, ids_t)
    np.testing.assert_allclose(s_f, s_t, atol=1e-5)


def test_metadata_and_save_load_roundtrip(built, small_corpus):
    d = built("flat")
    meta = json.loads((d / "meta.json").read_text())
    assert meta["kind"] == "flat" and meta["encoder"] == "minilm" and meta["dim"] == 384
    assert meta["num_passages"] == N_SMALL and len(meta["corpus_fingerprint"]) == 32
    assert not (d / "build").exists()
    a, b = open_retriever(d), open_retriever(d)
    qs = ["island exports of salt", "festival with lanterns"]
    assert a.search(qs, 4) == b.search(qs, 4)
    # a finished index is reused, not rebuilt
    assert build_index(small_corpus, d, IndexSpec(encoder="minilm", index_kind="flat")) == d


def test_encoder_and_corpus_mismatch_errors_say_which(built, small_corpus, tmp_path):
    d = built("flat")
    with pytest.raises(IndexMismatch, match="query encoder mismatch.*'minilm'.*'e5'"):
        open_retriever(d, encoder="e5")
    other = tmp_path / "other.jsonl"
    text = small_corpus.read_text()
    other.write_text(text.replace("harbour town", "harbour city", 1))
    with pytest.raises(IndexMismatch, match="corpus mismatch.*other.jsonl"):
        open_retriever(d, corpus_path=str(other))
    moved = tmp_path / "moved.jsonl"
    shutil.copy(small_corpus, moved)
    assert open_retriever(d, corpus_path=str(moved), encoder="minilm").search(["x"], 1)


def test_a_different_index_in_the_directory_is_refused(built, small_corpus):
    d = built("bm25")
    with pytest.raises(IndexDirError, match="already holds a different index"):
        build_index(small_corpus, d, IndexSpec(index_kind="flat"))
    with pytest.raises(IndexDirError, match="not a finished index"):
        open_retriever(d / "nothing-here")


def test_resume_after_an_interrupted_build(built, small_corpus, tmp_path, monkeypatch):
    calls = []
    real = Encoder.encode_passages

    def interrupted(self, texts, **kw):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(len(texts))
        return real(self, texts, **kw)

    out = tmp_path / "resumed"
    monkeypatch.setattr(Encoder, "encode_passages", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build_index(small_corpus, out, IndexSpec(index_kind="torch", chunk_size=32, max_passages=100))
    assert calls == [32, 32]
    assert sorted(p.name for p in (out / "build").glob("chunk_*.npy")) == ["chunk_000000.npy", "chunk_000001.npy"]
    with pytest.raises(IndexDirError, match="interrupted"):
        open_retriever(out)
    with pytest.raises(IndexDirError, match="chunk_size differ"):
        build_index(small_corpus, out, IndexSpec(index_kind="torch", chunk_size=16, max_passages=100))

    resumed = []

    def counting(self, texts, **kw):
        resumed.append(len(texts))
        return real(self, texts, **kw)

    monkeypatch.setattr(Encoder, "encode_passages", counting)
    build_index(small_corpus, out, IndexSpec(index_kind="torch", chunk_size=32, max_passages=100))
    assert resumed == [32, 4]  # only the chunks that were missing
    vectors = np.load(out / "vectors.npy")
    reference = flat_vectors(built("flat") / "index.faiss")[:100]
    np.testing.assert_allclose(vectors, reference, atol=1e-5)
    assert len(open_retriever(out)) == 100


def test_load_retriever_by_config(built):
    r = load_retriever(RetrieverConfig(kind="inprocess", index=str(built("bm25"))))
    assert isinstance(r, Retriever)
    assert r.search(["copper market"], 2)[0][0].title
    with pytest.raises(ValueError, match="k=0"):
        r.search(["copper market"], 0)
    c = load_retriever(RetrieverConfig(kind="http", url="http://127.0.0.1:9/retrieve", timeout_s=3, retries=2))
    assert isinstance(c, Retriever) and isinstance(c, HttpRetriever) and c.url == "http://127.0.0.1:9" and c.retries == 2


@pytest.mark.slow
def test_bundled_asks_for_the_bundled_corpus(bundled_rows):
    r = load_retriever(RetrieverConfig(kind="inprocess", index="bundled"))
    assert len(r) == len(bundled_rows) == 2400
    probes = [0, 999, 2399]
    got = r.search([bundled_rows[i]["contents"] for i in probes], 3)
    assert [g[0].id for g in got] == [bundled_rows[i]["id"] for i in probes]


def test_a_cached_index_follows_its_corpus_when_the_first_copy_is_gone(small_corpus, tmp_path):
    """The bundled index lives in a shared cache and records the corpus path of the checkout that
    built it; asked again for the same rows from another path, it reads them from there, so it
    still loads once the first checkout is deleted."""
    first, second = tmp_path / "a" / "corpus.jsonl", tmp_path / "b" / "corpus.jsonl"
    for p in (first, second):
        p.parent.mkdir()
        shutil.copy(small_corpus, p)
    out = tmp_path / "cache" / "bm25"
    build_index(first, out, IndexSpec(index_kind="bm25"))
    shutil.rmtree(first.parent)
    assert build_index(second, out, IndexSpec(index_kind="bm25")) == out   # reused, not rebuilt
    assert json.loads((out / "meta.json").read_text())["corpus_path"] == str(second.resolve())
    hits = open_retriever(out).search(["the"], k=2)[0]
    assert len(hits) == 2 and all(h.text for h in hits)
