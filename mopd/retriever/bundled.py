"""The bundled corpus (2,400 invented encyclopedia passages) and its cached default index."""

from __future__ import annotations

from pathlib import Path

from mopd.retriever.builder import IndexSpec, build_index
from mopd.retriever.corpus import default_cache_dir

BUNDLED_CORPUS = Path(__file__).resolve().parent / "data" / "bundled_corpus.jsonl"


def bundled_corpus_path() -> Path:
    return BUNDLED_CORPUS


def bundled_index(index_kind: str = "flat", encoder: str = "minilm", progress: bool = False) -> Path:
    """The index of the bundled corpus under ``$MOPD_CACHE/retriever`` (built on first use: about a
    minute on 2 CPU cores for the dense kinds, a second for BM25; later calls return at once)."""
    name = "bundled-bm25" if index_kind == "bm25" else f"bundled-{encoder}-{index_kind}"
    return build_index(BUNDLED_CORPUS, default_cache_dir() / "retriever" / name,
                       IndexSpec(encoder=encoder, index_kind=index_kind), progress=progress)
