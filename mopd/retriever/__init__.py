"""Retrieval for the Searcher: corpus, encoders, indexes, in-process retriever, HTTP server and client.

The interface the rest of the project uses::

    retriever = load_retriever(cfg.retriever)       # in-process index dir, or an HTTP client
    results = retriever.search(["who founded X?"], k=3)  # one list of Passage per query, best first
    prompt_block = format_passages(results[0])     # "Doc 1(Title: t) text\\nDoc 2(...) ..."

Heavy modules (torch, transformers, faiss, bm25s, aiohttp) are imported only when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from mopd.retriever.builder import IndexSpec, build_index
from mopd.retriever.bundled import bundled_corpus_path, bundled_index
from mopd.retriever.client import HttpRetriever, RetrieverUnavailable
from mopd.retriever.corpus import Corpus, CorpusError
from mopd.retriever.encoders import EncoderUnavailable
from mopd.retriever.identity import BUNDLED, NoRetriever, index_dir_of, index_fingerprint, retriever_identity
from mopd.retriever.index_errors import IndexDirError, IndexMismatch
from mopd.retriever.index_store import INDEX_KINDS
from mopd.retriever.local import LocalRetriever
from mopd.retriever.passage import Passage, format_passages

if TYPE_CHECKING:
    from mopd.config import RetrieverConfig


@runtime_checkable
class Retriever(Protocol):
    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        """Batched search: one list per query, best first."""
        ...


def open_retriever(index_dir, **kwargs) -> LocalRetriever:
    """An in-process retriever over ``index_dir``; see :class:`mopd.retriever.local.LocalRetriever`."""
    return LocalRetriever(index_dir, **kwargs)


def load_retriever(cfg: RetrieverConfig) -> Retriever:
    """``kind=inprocess``: the index directory ``cfg.index`` loaded here (``bundled``: the bundled
    corpus's MiniLM flat index, built into the cache on first use; empty: :class:`NoRetriever`, never
    a silent default); ``kind=http``: a client of ``cfg.url``."""
    if cfg.kind == "http":
        return HttpRetriever.for_config(cfg)
    if cfg.kind != "inprocess":
        raise ValueError(f"retriever.kind={cfg.kind!r} is not valid; choose inprocess or http")
    return open_retriever(index_dir_of(cfg))


__all__ = [
    "BUNDLED",
    "INDEX_KINDS",
    "Corpus",
    "CorpusError",
    "EncoderUnavailable",
    "HttpRetriever",
    "IndexDirError",
    "IndexMismatch",
    "IndexSpec",
    "NoRetriever",
    "Passage",
    "Retriever",
    "RetrieverUnavailable",
    "build_index",
    "bundled_corpus_path",
    "bundled_index",
    "format_passages",
    "index_fingerprint",
    "load_retriever",
    "open_retriever",
    "retriever_identity",
]
