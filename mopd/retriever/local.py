"""The in-process retriever: an index directory, its corpus and its query encoder in this process.

One :meth:`LocalRetriever.search_rows` call encodes all queries in one batch and searches them in
one index call; the HTTP server's micro-batcher relies on that to serve many clients per batch.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mopd.retriever import encoders
from mopd.retriever.corpus import Corpus
from mopd.retriever.identity import index_fingerprint
from mopd.retriever.index_check import check_data_files, check_encoder_dim, check_opened
from mopd.retriever.index_errors import IndexDirError
from mopd.retriever.index_store import IndexMeta, check_compatible, open_index, read_meta
from mopd.retriever.passage import Passage


class LocalRetriever:
    """``search(queries, k) -> list[list[Passage]]`` over an index directory.

    ``encoder`` / ``corpus_path``: the query encoder and corpus the caller means to use; each is
    checked against the index's metadata and a difference is an :class:`IndexMismatch` naming it.
    ``kind="torch"`` searches a flat FAISS index's vectors with torch (e.g. on a GPU without
    faiss-gpu); ``faiss_gpu`` moves a flat or IVF index to all GPUs (fp16, sharded)."""

    def __init__(self, index_dir, encoder: str | None = None, corpus_path: str | None = None,
                 encoder_path: str | None = None, device: str | None = None, kind: str | None = None,
                 faiss_gpu: bool = False, batch_size: int = 64):
        self.index_dir = Path(index_dir)
        self.meta: IndexMeta = read_meta(self.index_dir)
        check_compatible(self.meta, self.index_dir, encoder=encoder)
        # What it holds against its meta.json, its encoder and its corpus, before anything loads
        # (mopd.retriever.index_check): a damaged or mismatched index is one line here, not a
        # traceback or a failure of every search later.
        check_encoder_dim(self.meta, self.index_dir)
        check_data_files(self.meta, self.index_dir)
        self.corpus = Corpus(corpus_path or self.meta.corpus_path, cache_dir=self.index_dir)
        check_compatible(self.meta, self.index_dir, corpus_fingerprint=self.corpus.fingerprint,
                         corpus_path=str(self.corpus.path))
        self.index = open_index(self.index_dir, self.meta, kind=kind, device=device, faiss_gpu=faiss_gpu)
        check_opened(self.meta, self.index_dir, self.index, len(self.corpus))
        self.encoder = None
        if not self.index.needs_text:
            self.encoder = encoders.load_encoder(self.meta.encoder, encoder_path or self.meta.encoder_path or None,
                                                 device, batch_size)   # looked up when called: tests stand in for it
        self._lock = threading.Lock()
        self._fingerprint: str | None = None

    def __len__(self) -> int:
        return len(self.index)

    @property
    def kind(self) -> str:
        return self.index.kind

    @property
    def fingerprint(self) -> str:
        """The index's fingerprint (:func:`mopd.retriever.identity.index_fingerprint`), computed once."""
        if self._fingerprint is None:
            self._fingerprint = index_fingerprint(self.index_dir, self.meta)
        return self._fingerprint

    def search_rows(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Row ids [Q, k'] and scores [Q, k'] (k' = min(k, corpus size)) for all queries at once."""
        if not len(queries):
            return np.zeros((0, 0), np.int64), np.zeros((0, 0), np.float32)
        with self._lock:
            if self.encoder is None:
                return self.index.search(list(queries), k)
            return self.index.search(self.encoder.encode_queries(list(queries)), k)

    def passages(self, ids: np.ndarray, scores: np.ndarray) -> list[list[Passage]]:
        """Look up the rows of a search result (ids < 0, FAISS's 'no result', are dropped)."""
        return [[self.corpus.passage(int(i), float(s)) for i, s in zip(row_i, row_s) if i >= 0]
                for row_i, row_s in zip(ids, scores)]

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        if k < 1:
            raise ValueError(f"k={k} must be >= 1")
        return self.passages(*self.search_rows(queries, k))

    def self_check(self) -> None:
        """One search end to end (encoder, index, corpus rows): :class:`IndexDirError` naming what
        failed, for ``retriever serve``, which must not start on an index it cannot answer from."""
        try:
            found = self.search(["index self-check"], 1)
            if not isinstance(found, list) or len(found) != 1:
                raise ValueError("the search returned no result list")
        except IndexDirError:
            raise
        except Exception as e:  # noqa: BLE001 (whatever fails: the index cannot answer)
            raise IndexDirError(f"{self.index_dir} cannot answer a search ({type(e).__name__}: {str(e)[:300]}); "
                                "rebuild the index") from None
