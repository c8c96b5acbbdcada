"""Retriever speed: server queries/s with and without micro-batching, flat FAISS vs the torch index
at 100k and 1M vectors on CPU, and MiniLM encoder passages/s.

Run: .venv/bin/pytest -q bench/bench_retriever.py --benchmark-only -s
Each ratio compares two variants run in the same process; the numbers printed with -s (and kept in
each benchmark's extra_info) go by hand into the ## Retriever section of bench/RESULTS.md.

Client mixes (``.venv/bin/python bench/bench_retriever.py [--rounds N]``): three servers in this
process -- the default one (slicing only when a small request waits next to a big one, adaptive
window), the same server unsliced (``slice_work``, ``max_batch_work``, ``max_whole_work``
unbounded) and no batching
-- and, round by round with the order rotating, each mix against each: 1, 32 and 128 clients of
one-query requests, 1 and 4 clients of 64-query requests, every client sending back to back.
Targets: default >= 0.95x unsliced for every mix, >= 1x no batching for one client. The
fairness table (small clients' p99 next to a 1,024-query request) is ``bench_retriever_latency.py``.
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
from mopd.retriever.server import BATCHER, Batching, ServerThread

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

# (clients, queries per request, requests per client)
MIXES = {"1 x 1-query": (1, 1, 20), "32 x 1-query": (32, 1, 3), "128 x 1-query": (128, 1, 2),
         "1 x 64-query": (1, 64, 4), "4 x 64-query": (4, 64, 2)}
SERVERS = {"default": {}, "unsliced": dict(slice_work=10 ** 9, max_batch_work=10 ** 9, max_whole_work=10 ** 9),
           "no batching": dict(enabled=False)}
"""Each server's :class:`mopd.retriever.server.Batching` settings (besides a 2 ms window)."""


async def _mix(url: str, questions, clients: int, per_request: int, requests: int) -> float:
    """Queries/s of `clients` concurrent clients, each sending `requests` requests of
    `per_request` queries back to back."""
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def client(c):
            for j in range(requests):
                start = (c * 7919 + j * 131) % len(questions)
                qs = [questions[(start + i) % len(questions)] for i in range(per_request)]
                async with session.post(url + "/retrieve", json={"queries": qs, "topk": K}) as r:
                    assert r.status == 200, await r.text()
                    await r.read()

        t = time.perf_counter()
        await asyncio.gather(*(client(c) for c in range(clients)))
        return clients * requests * per_request / (time.perf_counter() - t)


def run_mixes(rounds: int, mixes=None, servers_=None) -> dict:
    import os
    import statistics

    retriever = open_retriever(bundled_index("flat", progress=True))
    rows = [json.loads(line) for line in open(bundled_corpus_path())]
    questions = [r["contents"].split("\n", 1)[0] + " history and trade" for r in rows]
    mixes = {m: MIXES[m] for m in (mixes or MIXES)}
    kinds = {n: SERVERS[n] for n in (servers_ or SERVERS)}
    servers = {name: ServerThread(retriever, batching=Batching(max_wait_ms=2, **kw)).start()
               for name, kw in kinds.items()}
    qps = {(m, s): [] for m in mixes for s in kinds}
    batches = {(m, s): [] for m in mixes for s in kinds}     # batch sizes each server formed
    fair = {m: 0 for m in mixes}                              # default server: batches cut slice by slice
    loads = []
    try:
        for srv in servers.values():
            asyncio.run(_mix(srv.url, questions, 8, 8, 1))  # warm-up: connections, encoder
        names = list(kinds)
        for r in range(rounds):
            loads.append(os.getloadavg()[0])
            for i, (mix, spec) in enumerate(mixes.items()):
                shift = (r + i) % len(names)
                for name in names[shift:] + names[:shift]:
                    # one untimed request per client first: the mix's steady state, not the last mix's
                    asyncio.run(_mix(servers[name].url, questions, spec[0], spec[1], 1))
                    st = servers[name].app[BATCHER].stats
                    seen, fair_before = len(st.batch_sizes), st.fair_batches
                    qps[(mix, name)].append(asyncio.run(_mix(servers[name].url, questions, *spec)))
                    batches[(mix, name)] += st.batch_sizes[seen:]
                    if name == "default":
                        fair[mix] += st.fair_batches - fair_before
                print(f"round {r + 1} {mix}: " + ", ".join(f"{n} {qps[(mix, n)][-1]:.1f}" for n in names),
                      flush=True)
    finally:
        for srv in servers.values():
            srv.stop()
    print(f"load average {min(loads):.1f}-{max(loads):.1f}; medians of {rounds} rounds")
    print("| clients x queries per request | default q/s | unsliced q/s | no batching q/s | default / unsliced "
          "(per round vs unsliced, else vs no batching) | default / no batching | mean batch, default / unsliced "
          "| sliced batches (default) |")
    print("|---|---|---|---|---|---|---|---|")
    out = {}
    for mix in mixes:
        med = {n: statistics.median(qps[(mix, n)]) for n in kinds}
        for n in SERVERS:
            med.setdefault(n, float("nan"))
            batches.setdefault((mix, n), [float("nan")])
        other = "unsliced" if "unsliced" in kinds else "no batching"
        per_round = [a / b for a, b in zip(qps[(mix, "default")], qps[(mix, other)])]
        out[mix] = med
        print(f"| {mix} | {med['default']:.1f} | {med['unsliced']:.1f} | {med['no batching']:.1f} | "
              f"{med['default'] / med['unsliced']:.2f}x ({', '.join(f'{x:.2f}' for x in per_round)}) | "
              f"{med['default'] / med['no batching']:.2f}x | "
              f"{np.mean(batches[(mix, 'default')]):.1f} / {np.mean(batches[(mix, 'unsliced')]):.1f} | "
              f"{fair[mix]} |", flush=True)
    return out


@pytest.mark.parametrize("batching", [False, True], ids=["no_batching", "micro_batching"])
def test_server_qps(benchmark, retriever, questions, batching):
    with ServerThread(retriever, batching=Batching(max_wait_ms=2, enabled=batching)) as srv:
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


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description="retrieval server: client mixes, default vs unsliced vs no batching")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--mixes", default=",".join(MIXES), help="comma-separated names of MIXES")
    p.add_argument("--servers", default=",".join(SERVERS), help="comma-separated names of SERVERS")
    a = p.parse_args()
    run_mixes(a.rounds, a.mixes.split(","), a.servers.split(","))
