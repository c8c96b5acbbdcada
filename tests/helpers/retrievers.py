"""An in-memory retriever with the project's retriever interface."""

from __future__ import annotations

from typing import List, Optional

from mopd.retriever import Passage


class FakeRetriever:
    """``k`` made-up passages per query (ids name the query, ``"{query}#{i}"``), every batch logged
    in ``batches``; after ``fail_after`` calls it raises ``RetrieverUnavailable`` (a lost server)."""

    def __init__(self, fail_after: Optional[int] = None):
        self.batches: List[List[str]] = []
        self.fail_after = fail_after

    @property
    def calls(self) -> int:
        return len(self.batches)

    def search(self, queries, k):
        from mopd.retriever import RetrieverUnavailable

        if self.fail_after is not None and self.calls >= self.fail_after:
            raise RetrieverUnavailable("http://127.0.0.1:1 (test): connection refused")
        self.batches.append(list(queries))
        return [[Passage(id=f"{q}#{i}", title=f"T{i}", text=f"passage {i} about {q}", score=1.0 - i / 10)
                 for i in range(k)] for q in queries]
