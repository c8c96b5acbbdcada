"""QueryMemo: every distinct new query is searched alone and remembered, so a query's passages never
depend on the queries searched with it."""

import numpy as np
import pytest

from mopd.retriever.memo import QueryMemo


class BatchSensitive:
    """A retriever whose answer to a query depends on its batch (as a padded encoder's does): it
    returns the query with the batch size appended, and records every call."""

    kind = "fake"

    def __init__(self):
        self.calls = []

    def search(self, queries, k):
        self.calls.append((list(queries), k))
        return [[f"{q}|batch{len(queries)}|k{k}"] for q in queries]


def test_each_new_query_is_searched_alone_once_and_answers_keep_the_order():
    inner = BatchSensitive()
    m = QueryMemo(inner)
    got = m.search(["b", "a", "b", "c"], 3)
    assert got == [["b|batch1|k3"], ["a|batch1|k3"], ["b|batch1|k3"], ["c|batch1|k3"]]
    assert inner.calls == [(["b"], 3), (["a"], 3), (["c"], 3)]
    assert m.search(["c", "a"], 3) == [["c|batch1|k3"], ["a|batch1|k3"]] and len(inner.calls) == 3
    assert m.search(["a"], 5) == [["a|batch1|k5"]] and inner.calls[-1] == (["a"], 5)


def test_the_answer_does_not_depend_on_the_batch():
    rng = np.random.default_rng(0)
    words = [f"q{i}" for i in range(30)]
    m = QueryMemo(BatchSensitive())
    first = {}
    for _ in range(20):
        batch = list(rng.choice(words, size=int(rng.integers(1, 12))))
        for q, r in zip(batch, m.search(batch, 3)):
            assert first.setdefault(q, r) == r


def test_oldest_entries_are_forgotten_beyond_the_bound_and_attributes_pass_through():
    inner = BatchSensitive()
    m = QueryMemo(inner, max_entries=2)
    assert m.search(["a", "b", "c"], 1) == [["a|batch1|k1"], ["b|batch1|k1"], ["c|batch1|k1"]]
    assert list(m.cache) == [("b", 1), ("c", 1)]
    m.search(["a"], 1)
    assert inner.calls[-1] == (["a"], 1)
    assert m.kind == "fake"
    with pytest.raises(ValueError):
        QueryMemo(inner, max_entries=0)


def test_minilm_vectors_depend_on_the_batch_but_memo_results_do_not(tmp_path):
    """The reason for the memo, on the real dense index: a query encoded in a batch differs in the last
    bits from the same query alone; through QueryMemo its results are the alone results."""
    from mopd.retriever import build_index, open_retriever
    from mopd.retriever.encoders import load_encoder

    corpus = tmp_path / "c.jsonl"
    import json

    rows = [{"id": str(i), "contents": f"Band {i}\nThe band {i} was formed in town {i % 7} by the river {i % 3}."}
            for i in range(40)]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    build_index(corpus, tmp_path / "idx")
    enc = load_encoder("minilm")
    qs = ["Where was band 3 formed?", "river of town 5 and the long name of the band 12 formed there", "band 7"]
    alone = np.stack([enc.encode_queries([q])[0] for q in qs])
    assert not np.array_equal(alone, enc.encode_queries(qs))   # batching changes the bits
    inner = open_retriever(tmp_path / "idx")
    m = QueryMemo(inner)
    together = m.search(qs, 3)
    for q, r in zip(qs, together):
        ref = inner.search([q], 3)[0]
        assert [(p.id, p.score) for p in r] == [(p.id, p.score) for p in ref]
