"""Retriever speed: server queries/s with and without micro-batching, flat FAISS vs the torch index
at 100k and 1M vectors on CPU, and MiniLM encoder passages/s.

Run: .venv/bin/pytest -q bench/bench_retriever.py --benchmark-only -s
Each ratio compares two variants run in the same process; the numbers printed with -s (and kept in
each benchmark's extra_info) go by hand into the ## Retriever section of bench/RESULTS.md.
"""

import asyncio
import json
import time

import numpy as np
import pytest

from mopd.retriever import bundled_corpus_path, bundled_index, open_retriever
from mopd.retriever.encoders import load_encoder
from mopd.retriever.index_faiss import FaissIndex, build_faiss
from mopd.retriever.index_torch import TorchIndex
from mopd.retriever.server import ServerThread

CLIENTS = 64
REQUESTS_PER_CLIENT = 4
DIM = 384          # MiniLM's dimension
QUERY_BATCH = 64   # queries per index call
K = 3


@pytest.fixture(scope="module")
def retriever():
    return open_retriever(bundled_index("flat", progress=True))


@pytest.fixture(scope="module")
def questions():
    rows = [json.loads(line) for line in open(bundled_corpus_path())]
    return [r["contents"].split("\n", 1)[0] + " history and trade" for r in rows]


async def _load(url: str, questions, clients: int, per_client: int) -> float:
    """`clients` concurrent clients, each sending `per_client` one-query requests back to back."""
    import aiohttp

    async with aiohttp.ClientSession() as session:
        async def client(c):
            for j in range(per_client):
                q = questions[(c * per_client + j) % len(questions)]
                async with session.post(url + "/retrieve", json={"queries": [q], "topk": K}) as r:
                    assert r.status == 200
                    await r.json()

        t = time.perf_counter()
        await asyncio.gather(*(client(c) for c in range(clients)))
        return time.perf_counter() - t


RESULTS = {}


@pytest.mark.parametrize("batching", [False, True], ids=["no_batching", "micro_batching"])
def test_server_qps(benchmark, retriever, questions, batching):
    with ServerThread(retriever, batching=batching, max_wait_ms=2) as srv:
        asyncio.run(_load(srv.url, questions, 8, 1))  # warm-up
        seconds = benchmark.pedantic(lambda: asyncio.run(_load(srv.url, questions, CLIENTS, REQUESTS_PER_CLIENT)),
                                     rounds=3, iterations=1)
    qps = CLIENTS * REQUESTS_PER_CLIENT / benchmark.stats.stats.mean
    benchmark.extra_info["queries_per_s"] = round(qps, 1)
    RESULTS[("server", batching)] = qps
    print(f"\nserver {'micro-batching' if batching else 'no batching'}: {qps:.1f} queries/s "
          f"({CLIENTS} clients x {REQUESTS_PER_CLIENT} requests of 1 query)")
    if ("server", False) in RESULTS and ("server", True) in RESULTS:
        print(f"micro-batching speed-up: {RESULTS[('server', True)] / RESULTS[('server', False)]:.1f}x")
    del seconds


@pytest.fixture(scope="module")
def vectors_1m():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1_000_000, DIM), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = x[rng.choice(len(x), QUERY_BATCH, replace=False)] + 0.01 * rng.standard_normal((QUERY_BATCH, DIM), dtype=np.float32)
    return x, q


@pytest.mark.parametrize("n", [100_000, 1_000_000], ids=["100k", "1M"])
@pytest.mark.parametrize("kind", ["faiss_flat", "torch"])
def test_index_search(benchmark, vectors_1m, n, kind):
    x, q = vectors_1m
    x = x[:n]
    index = FaissIndex(build_faiss("flat", DIM, n, [x]), "flat") if kind == "faiss_flat" else TorchIndex(x)
    ids, _ = index.search(q, K)
    benchmark.pedantic(lambda: index.search(q, K), rounds=5, iterations=1, warmup_rounds=1)
    qps = QUERY_BATCH / benchmark.stats.stats.mean
    benchmark.extra_info["queries_per_s"] = round(qps, 1)
    RESULTS[(kind, n)] = qps
    print(f"\n{kind} n={n}: {benchmark.stats.stats.mean * 1e3:.1f} ms per batch of {QUERY_BATCH} queries "
          f"({qps:.0f} queries/s)")
    other = "torch" if kind == "faiss_flat" else "faiss_flat"
    if (other, n) in RESULTS:
        print(f"torch / faiss flat speed at n={n}: {RESULTS[('torch', n)] / RESULTS[('faiss_flat', n)]:.2f}x")


@pytest.mark.parametrize("batch_size", [1, 64])
def test_encoder_passages_per_s(benchmark, batch_size):
    rows = [json.loads(line)["contents"] for line in open(bundled_corpus_path())][:256]
    enc = load_encoder("minilm", device="cpu", batch_size=batch_size)
    enc.encode_passages(rows[:16])
    benchmark.pedantic(lambda: enc.encode_passages(rows), rounds=2, iterations=1)
    pps = len(rows) / benchmark.stats.stats.mean
    benchmark.extra_info["passages_per_s"] = round(pps, 1)
    RESULTS[("encoder", batch_size)] = pps
    print(f"\nMiniLM encoder batch {batch_size}: {pps:.1f} passages/s")
