import numpy as np
import pytest
import torch

from mopd.retriever.index_bm25 import BM25Index
from mopd.retriever.index_faiss import FaissIndex, build_faiss, flat_vectors, ivf_lists
from mopd.retriever.index_torch import TorchIndex, chunked_topk


def _unit(rng, n, d):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _brute(q, x, k):
    s = q @ x.T
    ids = np.argsort(-s, axis=1, kind="stable")[:, :k]
    return ids, np.take_along_axis(s, ids, 1)


@pytest.mark.parametrize("n,chunk,k", [(1037, 100, 7), (50, 64, 3), (13, 4, 20), (300, 1, 5)])
def test_chunked_topk_equals_brute_force(n, chunk, k):
    rng = np.random.default_rng(n)
    x, q = _unit(rng, n, 24), _unit(rng, 9, 24)
    s, i = chunked_topk(torch.from_numpy(q), torch.from_numpy(x), k, chunk)
    ref_i, ref_s = _brute(q, x, min(k, n))
    assert i.shape == (9, min(k, n))
    np.testing.assert_array_equal(i.numpy(), ref_i)
    np.testing.assert_allclose(s.numpy(), ref_s, rtol=1e-5, atol=1e-6)


def test_torch_and_faiss_flat_agree_with_brute_force_and_roundtrip(tmp_path):
    rng = np.random.default_rng(1)
    x, q = _unit(rng, 777, 32), _unit(rng, 17, 32)
    ref_i, ref_s = _brute(q, x, 5)
    TorchIndex.write(tmp_path, x)
    ti = TorchIndex.load(tmp_path, device="cpu")
    ti.chunk_rows = 100
    fi = FaissIndex(build_faiss("flat", 32, len(x), [x[:400], x[400:]]), "flat")
    fi.write(tmp_path)
    fi2 = FaissIndex.load(tmp_path, kind="flat")
    for idx in (ti, fi, fi2):
        i, s = idx.search(q, 5)
        assert i.dtype == np.int64 and s.dtype == np.float32
        np.testing.assert_array_equal(i, ref_i)
        np.testing.assert_allclose(s, ref_s, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(flat_vectors(tmp_path / "index.faiss"), x)
    assert fi.search(q, 10_000)[0].shape == (17, 777)  # k beyond N: all rows


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
def test_approximate_indexes_find_known_items(tmp_path, kind):
    rng = np.random.default_rng(2)
    x = _unit(rng, 3000, 32)
    idx = FaissIndex(build_faiss(kind, 32, len(x), [x[:1000], x[1000:]], x[rng.choice(3000, 2000, replace=False)]), kind)
    idx.write(tmp_path)
    idx = FaissIndex.load(tmp_path, kind=kind)
    probe = rng.choice(3000, 200, replace=False)
    ids, _ = idx.search(x[probe], 3)
    assert (ids[:, 0] == probe).mean() >= 0.97
    if kind == "ivf":
        assert ivf_lists(3000) == 76 and ivf_lists(10) == 1


def test_bm25_ranks_matching_rows_first_and_roundtrips(tmp_path):
    texts = ["the red fox jumps", "a blue whale swims far", "red red apples and pears", "quiet night"]
    idx = BM25Index.build(iter(texts), len(texts))
    ids, scores = idx.search(["blue whale", "red apples", "zzz unknown", ""], 2)
    assert ids.shape == (4, 2) and ids[0, 0] == 1 and ids[1, 0] == 2
    assert scores[0, 0] > 0 and np.all(scores[2] == 0) and np.all(scores[3] == 0)
    idx.write(tmp_path)
    again = BM25Index.load(tmp_path)
    assert len(again) == 4
    ids2, scores2 = again.search(["blue whale", "red apples", "zzz unknown", ""], 2)
    np.testing.assert_array_equal(ids2[:2], ids[:2])
    np.testing.assert_allclose(scores2, scores)
    assert again.search(["fox"], 99)[0].shape == (1, 4)


def test_a_missing_faiss_names_the_extra_that_installs_it(monkeypatch):
    import builtins

    from mopd.retriever import IndexDirError
    from mopd.retriever.index_faiss import new_index

    real = builtins.__import__

    def no_faiss(name, *a, **k):
        if name == "faiss":
            raise ModuleNotFoundError("No module named 'faiss'")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_faiss)
    with pytest.raises(IndexDirError, match=r"multiagent-opd\[cpu\]"):
        new_index("flat", 8, 10)
