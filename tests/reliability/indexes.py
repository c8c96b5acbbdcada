"""Small index directories for the damaged-input probes, built in well under a second each: a BM25
index (bm25s, no encoder) and a flat FAISS index of random unit vectors with a MiniLM meta.json
(its load-time checks run before any encoder loads, so none is needed)."""

import json
import shutil

import numpy as np


def write_corpus(path, n, word="Band"):
    """``n`` rows ``{"id": i, "contents": "<word> i\\n<word> i was formed in town i%3."}``; returns the path."""
    path.write_text("".join(json.dumps({"id": str(i), "contents": f"{word} {i}\n{word} {i} was formed in town "
                                                                  f"{i % 3}, by the river {i % 7}."}) + "\n"
                            for i in range(n)))
    return path


def bm25_index(root, n=12, word="Band"):
    """A BM25 index of an ``n``-row corpus in ``root/index`` (the corpus in ``root/corpus.jsonl``)."""
    from mopd.retriever import build_index
    from mopd.retriever.builder import IndexSpec

    root.mkdir(parents=True, exist_ok=True)
    corpus = write_corpus(root / "corpus.jsonl", n, word)
    return build_index(corpus, root / "index", IndexSpec(index_kind="bm25"))


def flat_index(root, n=12, dim=384, seed=0):
    """A flat inner-product FAISS index of ``n`` random unit vectors over an ``n``-row corpus,
    recorded as a MiniLM index (dimension 384) the way the builder records one."""
    import faiss

    from mopd.retriever import index_store
    from mopd.retriever.corpus import corpus_fingerprint
    from mopd.retriever.index_store import IndexMeta, write_meta

    root.mkdir(parents=True, exist_ok=True)
    corpus = write_corpus(root / "corpus.jsonl", n)
    out = root / "index"
    out.mkdir()
    faiss.write_index(flat_vectors(n, dim, seed), str(out / "index.faiss"))
    meta = IndexMeta(kind="flat", encoder="minilm", dim=dim, corpus_path=str(corpus.resolve()),
                     corpus_fingerprint=corpus_fingerprint(corpus), num_passages=n)
    if hasattr(index_store, "data_hash"):       # (absent from older versions: the probes run there too)
        meta.data_hash = index_store.data_hash(out, meta)
    write_meta(out, meta)
    return out


def flat_vectors(n, dim, seed=0):
    import faiss

    x = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    index = faiss.IndexFlatIP(dim)
    index.add(x)
    return index


def copy_index(index_dir, dest):
    """A copy of an index directory to damage (its meta.json still names the original corpus)."""
    shutil.copytree(index_dir, dest)
    return dest


def truncate(path, nbytes=5):
    data = path.read_bytes()
    path.write_bytes(data[:-nbytes])
