"""Sparse BM25 index through ``bm25s`` (Lucene-style scoring, English stopwords, no stemming).

Unlike the dense indexes it searches query texts, not vectors (``needs_text = True``). The
tokeniser's vocabulary is saved beside the index so queries map to the same token ids; query words
never seen in the corpus are dropped, and a query with no known word scores 0 against every row.
Memory: bm25s keeps the token ids of the whole corpus while indexing, so it suits corpora of up to
a few million passages; the saved index is memory-mapped when loaded.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from mopd.retriever.index_errors import IndexDirError

BM25_DIR = "bm25"


def _tokenizer():
    from bm25s.tokenization import Tokenizer

    return Tokenizer(stopwords="en")


class BM25Index:
    kind = "bm25"
    needs_text = True
    dim = 0

    def __init__(self, model, tokenizer, n: int):
        self.model, self.tokenizer, self.n = model, tokenizer, n

    def __len__(self) -> int:
        return self.n

    @classmethod
    def build(cls, texts: Iterable[str], n: int) -> BM25Index:
        import bm25s

        tok = _tokenizer()
        ids = list(tok.streaming_tokenize(texts, update_vocab=True))
        model = bm25s.BM25()
        model.index(ids, show_progress=False)
        return cls(model, tok, n)

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        k = min(k, self.n)
        q = self.tokenizer.tokenize(list(queries), update_vocab=False, return_as="ids", show_progress=False)
        docs, scores = self.model.retrieve(q, k=k, show_progress=False, n_threads=0)
        return np.asarray(docs, dtype=np.int64).reshape(len(queries), k), \
            np.asarray(scores, dtype=np.float32).reshape(len(queries), k)

    def write(self, out_dir: Path) -> None:
        d = Path(out_dir) / BM25_DIR
        self.model.save(str(d))
        self.tokenizer.save_vocab(str(d))

    @classmethod
    def load(cls, index_dir: Path, **_) -> BM25Index:
        import bm25s


        d = Path(index_dir) / BM25_DIR
        try:
            model = bm25s.BM25.load(str(d), mmap=True, show_progress=False)
            tok = _tokenizer()
            tok.load_vocab(str(d))
            n = int(model.scores["num_docs"])
        except Exception as e:  # noqa: BLE001 (json, numpy and bm25s errors of a damaged file)
            raise IndexDirError(f"the BM25 index in {d} cannot be read ({type(e).__name__}: {str(e)[:200]}): a file "
                                "is truncated or damaged; rebuild it with `mopd retriever build-index`") from None
        return cls(model, tok, n)
