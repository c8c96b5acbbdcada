"""Retrieval server latency under a large request: do small clients still get answered promptly?

32 clients send one-query requests back to back (topk 3) for a fixed window; their p50/p99
latencies are measured alone, then while another client keeps sending the largest request the
server allows (``ServerLimits`` defaults: 1,024 queries x topk 8 = 8,192 results), with
search-length queries and with queries of the maximum length (2,048 characters). The last phase
repeats the search-length case with slicing switched off (one slice = the whole request: how the
server behaved before), to show what the scheduling buys. Target: p99 with the large
request below 2x the p99 without it.

Run: .venv/bin/pytest -q bench/bench_retriever_latency.py --benchmark-only -s
(or .venv/bin/python bench/bench_retriever_latency.py; MOPD_BENCH_WINDOW_S sets the window,
MOPD_BENCH_RETURN_WAIT_MS the server's --return-wait-ms). The heap is frozen after loading, as
`mopd retriever serve` does (mopd.retriever.server.freeze_heap). Index: the bundled corpus's MiniLM flat
index (2,400 passages). The numbers go by hand into bench/RESULTS.md, "Retriever latency under load".
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import threading
import time
import urllib.request

import numpy as np

from mopd.retriever import bundled_corpus_path, bundled_index, open_retriever
from mopd.retriever.server import BATCHER, Batching, ServerLimits, ServerThread, freeze_heap

CLIENTS = 32
WINDOW_S = float(os.environ.get("MOPD_BENCH_WINDOW_S", "20"))
TOPK = 3


def _questions() -> list[str]:
    with open(bundled_corpus_path()) as f:
        rows = [json.loads(line) for line in f]
    return [r["contents"].split("\n", 1)[0] + " history and trade" for r in rows]


async def _small_clients(url: str, questions: list[str], seconds: float) -> list[float]:
    import aiohttp

    lat: list[float] = []
    stop = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def client(c: int) -> None:
            j = 0
            while time.perf_counter() < stop:
                q = questions[(c * 7919 + j * 31) % len(questions)]
                j += 1
                t = time.perf_counter()
                async with session.post(url + "/retrieve", json={"queries": [q], "topk": TOPK}) as r:
                    assert r.status == 200, await r.text()
                    await r.read()
                lat.append(time.perf_counter() - t)

        await asyncio.gather(*(client(c) for c in range(CLIENTS)))
    return lat


def _largest_request(questions: list[str], limits: ServerLimits, long_queries: bool) -> bytes:
    n = limits.max_queries
    k = limits.max_results // n
    if long_queries:
        qs = [(questions[i % len(questions)] + " ") * (limits.max_query_chars // 20) for i in range(n)]
        qs = [q[:limits.max_query_chars] for q in qs]
    else:
        qs = [questions[(i * 13) % len(questions)] for i in range(n)]
    return json.dumps({"queries": qs, "topk": k}).encode()


class _LargeClient(threading.Thread):
    """Sends the large request again and again until stopped (the answer is read, not parsed)."""

    def __init__(self, url: str, body: bytes):
        super().__init__(daemon=True)
        self.url, self.body, self.stop, self.sent, self.answered = url, body, threading.Event(), 0, 0

    def run(self) -> None:
        while not self.stop.is_set():
            req = urllib.request.Request(self.url + "/retrieve", data=self.body,
                                         headers={"Content-Type": "application/json"})
            self.sent += 1
            try:
                with urllib.request.urlopen(req, timeout=3600) as r:
                    r.read()
            except OSError:           # the server stopping under the request at the end of a phase
                if self.stop.is_set():
                    return
                raise
            self.answered += 1


def _phase(retriever, questions, large: bytes | None, seconds: float, batching: Batching = Batching()) -> dict:
    srv = ServerThread(retriever, batching=batching).start()
    asyncio.run(_small_clients(srv.url, questions, 2.0))     # warm-up: connections, encoder
    big = None
    if large is not None:
        big = _LargeClient(srv.url, large)
        big.start()
        while srv.app is None or srv.app[BATCHER].stats.requests == 0 or big.sent == 0:
            time.sleep(0.05)
        time.sleep(0.5)                                       # the large request is being served
    lat = np.array(asyncio.run(_small_clients(srv.url, questions, seconds)))
    out = {"requests": len(lat), "p50_ms": float(np.percentile(lat, 50) * 1e3),
           "p99_ms": float(np.percentile(lat, 99) * 1e3), "max_ms": float(lat.max() * 1e3)}
    if big is not None:
        big.stop.set()
        out["large_answered_in_window"] = big.answered
    if large is None or batching.slice_work < 10 ** 8:
        srv.stop()
    return out


def run(seconds: float = WINDOW_S) -> dict:
    retriever = open_retriever(bundled_index("flat", progress=True))
    questions = _questions()
    freeze_heap()                  # as `mopd retriever serve` does after loading
    limits = ServerLimits()
    wait = os.environ.get("MOPD_BENCH_RETURN_WAIT_MS")    # the server's --return-wait-ms (default 50)
    batching = Batching(return_wait_ms=float(wait)) if wait else Batching()
    search_length, max_length = (_largest_request(questions, limits, long) for long in (False, True))
    try:
        results = {"alone": _phase(retriever, questions, None, seconds)}
        results["large_search_length"] = _phase(retriever, questions, search_length, seconds, batching)
        results["large_max_length"] = _phase(retriever, questions, max_length, seconds, batching)
        # Before the scheduling: a request was one batch however large (left running at the end).
        unsliced = Batching(slice_work=10 ** 9, max_batch_work=10 ** 9, max_whole_work=10 ** 9)
        results["large_search_length_unsliced"] = _phase(retriever, questions, search_length, seconds, unsliced)
    finally:
        gc.unfreeze()              # frozen objects would be reported as leaked at exit
    base = results["alone"]["p99_ms"]
    for name, r in results.items():
        r["p99_ratio"] = r["p99_ms"] / base
        print(f"{name:32s} {r['requests']:6d} requests  p50 {r['p50_ms']:8.1f} ms  p99 {r['p99_ms']:8.1f} ms  "
              f"max {r['max_ms']:8.1f} ms  p99 / alone {r['p99_ratio']:.2f}x"
              + (f"  (large answered {r['large_answered_in_window']})" if "large_answered_in_window" in r else ""),
              flush=True)
    return results


def test_small_request_latency_under_the_largest_request(benchmark):
    results = {}

    def once():
        results.update(run())

    benchmark.pedantic(once, rounds=1, iterations=1)
    for name, r in results.items():
        benchmark.extra_info[name] = {k: round(v, 2) for k, v in r.items()}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="small clients' latency next to the largest request the server allows")
    ap.add_argument("--seconds", type=float, default=WINDOW_S,
                    help=f"each phase's window (default {WINDOW_S:g}, or MOPD_BENCH_WINDOW_S)")
    run(ap.parse_args().seconds)
