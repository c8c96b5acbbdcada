import asyncio
import json
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

from mopd.retriever import HttpRetriever, RetrieverUnavailable, open_retriever
from mopd.retriever.batcher import MicroBatcher
from mopd.retriever.client import RetrieverRequestError
from mopd.retriever.server import Batching, ServerLimits, ServerThread


def _post(url, body: bytes):
    req = urllib.request.Request(url + "/retrieve", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def flat_retriever(built):
    return open_retriever(built("flat"))


@pytest.fixture(scope="module")
def server(flat_retriever):
    limits = ServerLimits(max_topk=50, max_queries=64, max_results=400, max_query_chars=1000,
                          max_body_bytes=64 << 10)
    with ServerThread(flat_retriever, limits=limits, batching=Batching(max_wait_ms=20)) as srv:
        yield srv


def test_response_shape_is_search_r1s(server, flat_retriever, bundled_rows):
    q = [bundled_rows[3]["contents"], "lanterns festival"]
    status, body = _post(server.url, json.dumps({"queries": q, "topk": 3, "return_scores": True}).encode())
    assert status == 200 and list(body) == ["result"] and len(body["result"]) == 2
    for row in body["result"]:
        assert len(row) == 3
        for item in row:
            assert set(item) == {"document", "score"} and set(item["document"]) == {"id", "contents"}
            assert isinstance(item["document"]["id"], str) and isinstance(item["score"], float)
    assert body["result"][0][0]["document"] == {"id": bundled_rows[3]["id"], "contents": bundled_rows[3]["contents"]}
    status, bare = _post(server.url, json.dumps({"queries": q, "topk": 2}).encode())  # return_scores defaults off
    assert status == 200
    assert bare["result"] == [[it["document"] for it in row[:2]] for row in body["result"]]
    status, default_k = _post(server.url, json.dumps({"queries": q[:1]}).encode())
    assert len(default_k["result"][0]) == 3


def test_client_matches_in_process_retriever(server, flat_retriever):
    qs = ["a shipwright born in a harbour town", "plum wine", "white roofs"]
    remote = HttpRetriever(server.url, timeout_s=30, retries=0).search(qs, 4)
    local = flat_retriever.search(qs, 4)
    assert [[p.id for p in r] for r in remote] == [[p.id for p in r] for r in local]
    for r, loc in zip(remote, local):
        for a, b in zip(r, loc):
            assert (a.title, a.text) == (b.title, b.text) and a.score == pytest.approx(b.score, abs=1e-5)
    split = HttpRetriever(server.url, retries=0, max_queries_per_request=2).search(qs, 2)  # 2 requests
    assert [[p.id for p in r] for r in split] == [[p.id for p in r[:2]] for r in local]


def test_32_concurrent_clients_all_answered_as_serially(server, bundled_rows):
    client = HttpRetriever(server.url, timeout_s=60, retries=0)
    queries = [[bundled_rows[(7 * i) % 200]["contents"], f"town number {i}"] for i in range(32)]
    ks = [1 + i % 4 for i in range(32)]
    serial = [client.search(q, k) for q, k in zip(queries, ks)]
    before = client.health()
    results = [None] * 32
    barrier = threading.Barrier(32)

    def worker(i):
        barrier.wait()
        results[i] = client.search(queries[i], ks[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = client.health()
    assert after["requests"] - before["requests"] == 32
    assert after["batches"] - before["batches"] <= 32
    for got, want, k in zip(results, serial, ks):
        assert [[p.id for p in r] for r in got] == [[p.id for p in r] for r in want]
        assert all(len(r) == k for r in got)
        np.testing.assert_allclose([[p.score for p in r] for r in got], [[p.score for p in r] for r in want],
                                   atol=1e-5)


BAD = [
    (b"not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (b"{}", 400, "missing field 'queries'"),
    (b'{"queries": []}', 400, "empty"),
    (b'{"queries": "one string"}', 400, "must be a list"),
    (b'{"queries": ["ok", 3]}', 400, "queries\\[1\\] is int"),
    (b'{"queries": ["a"], "topk": 0}', 400, "out of range"),
    (b'{"queries": ["a"], "topk": 51}', 400, "out of range"),
    (b'{"queries": ["a"], "topk": "3"}', 400, "must be an integer"),
    (b'{"queries": ["a"], "return_scores": "yes"}', 400, "return_scores"),
    (json.dumps({"queries": ["q"] * 65}).encode(), 400, "too many queries"),
    (json.dumps({"queries": ["x" * (70 << 10)]}).encode(), 413, "too large"),
    (b'{"queries": ["ok", ""]}', 400, "queries\\[1\\] is empty or blank"),
    (b'{"queries": [" \\t\\n "]}', 400, "queries\\[0\\] is empty or blank"),
    (json.dumps({"queries": ["x" * 1001]}).encode(), 400, "1001 characters > 1000"),
    (json.dumps({"queries": ["q"] * 10, "topk": 50}).encode(), 400, "too much work: 10 queries x topk 50"),
    (b"[" * 50000, 400, "nested too deeply"),
    (b'{"queries": ' + b"[" * 50000, 400, "nested too deeply|not valid JSON"),
]


@pytest.mark.parametrize("body,status,message", BAD, ids=[m for _, _, m in BAD])
def test_bad_requests_get_4xx_and_the_server_keeps_serving(server, body, status, message):
    got, answer = _post(server.url, body)
    assert got == status
    assert pytest.importorskip("re").search(message, answer["error"])
    health = HttpRetriever(server.url, retries=0).health()
    assert health["status"] == "ok"
    assert _post(server.url, b'{"queries": ["copper"], "topk": 1}')[0] == 200


def test_client_raises_request_errors_without_retrying(server):
    with pytest.raises(RetrieverRequestError, match="HTTP 400.*out of range"):
        HttpRetriever(server.url, retries=3).search(["a"], 0)


def test_unreachable_server_raises_with_url_after_retries():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    c = HttpRetriever(f"http://127.0.0.1:{port}", timeout_s=2, retries=2, backoff_s=0.01)
    with pytest.raises(RetrieverUnavailable, match=f"127.0.0.1:{port}/retrieve unavailable after 3 attempts"):
        c.search(["q"], 3)


class _Flaky:
    """A retriever whose first `fail` searches raise (the server answers 500)."""

    def __init__(self, inner, fail):
        self.inner, self.fail = inner, fail
        self.meta, self.corpus, self.kind = inner.meta, inner.corpus, inner.kind

    def __len__(self):
        return len(self.inner)

    def search_rows(self, queries, k):
        if self.fail > 0:
            self.fail -= 1
            raise RuntimeError("index hiccup")
        return self.inner.search_rows(queries, k)


def test_server_errors_are_retried_then_succeed(built):
    inner = open_retriever(built("bm25"))
    with ServerThread(_Flaky(inner, 2)) as srv:
        got = HttpRetriever(srv.url, retries=3, backoff_s=0.01).search(["copper market"], 2)
        assert [p.id for p in got[0]] == [p.id for p in inner.search(["copper market"], 2)[0]]
    with ServerThread(_Flaky(inner, 5)) as srv, pytest.raises(RetrieverUnavailable, match="HTTP 500.*index hiccup"):
        HttpRetriever(srv.url, retries=1, backoff_s=0.01).search(["x"], 1)


def test_no_batching_mode_serves_too(built):
    with ServerThread(open_retriever(built("bm25")), batching=Batching(enabled=False)) as srv:
        c = HttpRetriever(srv.url, retries=0)
        assert len(c.search(["a", "b"], 2)) == 2
        assert c.health()["batching"] is False


def _fake_search(queries, k):
    """Row r of a batch holds ids r*100 + 0..k-1, so a request's slice shows where it landed."""
    ids = np.array([[int(q) * 100 + j for j in range(k)] for q in queries], dtype=np.int64)
    return ids, -ids.astype(np.float32)


def test_micro_batcher_gathers_concurrent_requests_into_one_call():
    calls = []

    def search(queries, k):
        calls.append((list(queries), k))
        return _fake_search(queries, k)

    async def main():
        b = MicroBatcher(search, max_wait_s=0.05, max_batch_queries=1000)
        await b.start()
        reqs = [([str(i), str(i + 1000)][: 1 + i % 2], 1 + i % 5) for i in range(64)]
        out = await asyncio.gather(*(b.submit(q, k) for q, k in reqs))
        await b.stop()
        return reqs, out, b.stats

    reqs, out, stats = asyncio.run(main())
    assert len(calls) == 1 and calls[0][1] == 5 and stats.batches == 1 and stats.requests == 64
    for (q, k), (ids, scores) in zip(reqs, out):
        assert ids.shape == (len(q), k)
        np.testing.assert_array_equal(ids, _fake_search(q, k)[0])


def test_micro_batcher_respects_max_batch_and_propagates_errors():
    sizes = []

    def search(queries, k):
        sizes.append(len(queries))
        if "boom" in queries:
            raise RuntimeError("boom")
        return _fake_search([q for q in queries], k)

    async def main():
        b = MicroBatcher(search, max_wait_s=0.01, max_batch_queries=10)
        await b.start()
        ok = await asyncio.gather(*(b.submit([str(i)] * 3, 2) for i in range(12)))
        with pytest.raises(RuntimeError, match="boom"):
            await b.submit(["boom"], 1)
        after = await b.submit(["7"], 1)  # the worker survived the error
        await b.stop()
        return ok, after

    ok, after = asyncio.run(main())
    assert max(sizes[:-2]) <= 12 and sum(sizes[:-2]) == 36  # a batch stops once it reaches 10 queries
    assert all(np.array_equal(ids, _fake_search([str(i)] * 3, 2)[0]) for i, (ids, _) in enumerate(ok))
    assert after[0].tolist() == [[700]]


def _get(url, method="GET"):
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.headers, json.loads(e.read())


def test_unknown_paths_and_methods_answer_json(server):
    status, headers, body = _get(server.url + "/nope")
    assert status == 404 and "POST /retrieve" in body["error"] and headers["Content-Type"].startswith("application/json")
    status, headers, body = _get(server.url + "/retrieve")        # GET on a POST route
    assert status == 405 and "POST" in body["error"] and "POST" in headers["Allow"]
    status, _, body = _get(server.url + "/health", method="DELETE")
    assert status == 405 and "GET" in body["error"]


def test_port_in_use_is_found_before_the_index_loads(tmp_path, capsys):
    import socket

    from mopd.cli import main
    from mopd.retriever.server import PortInUse, check_port

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(PortInUse, match=f"127.0.0.1:{port}"):
            check_port("127.0.0.1", port)
        # the index does not exist: had it been opened first, the error would be about the index
        assert main(["retriever", "serve", "--index", str(tmp_path / "none"), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "Traceback" not in err and err.count("\n") == 1
    check_port("127.0.0.1", port)   # free again


def test_a_negative_wait_is_refused_before_the_index_loads(tmp_path, capsys):
    from mopd.cli import main

    assert main(["retriever", "serve", "--index", str(tmp_path / "none"), "--return-wait-ms", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--return-wait-ms -1.0" in err and "Traceback" not in err and err.count("\n") == 1


def test_serve_freezes_what_it_loaded_and_unfreezes_on_the_way_out(flat_retriever, monkeypatch):
    """The server's heap is frozen while it serves (no full collections scanning the loaded model
    between requests) and thawed when it stops, whether it stopped cleanly or not."""
    import gc

    from mopd.retriever import server as server_mod

    seen = []

    async def start_server(app, sock):
        seen.append(gc.get_freeze_count())
        raise KeyboardInterrupt

    monkeypatch.setattr(server_mod, "start_server", start_server)
    assert gc.get_freeze_count() == 0
    with pytest.raises(KeyboardInterrupt):
        server_mod.serve(flat_retriever, port=0)
    assert seen[0] > 1000 and gc.get_freeze_count() == 0


def test_limits_are_checked():
    with pytest.raises(ValueError, match="max_results"):
        ServerLimits(max_results=0)
    with pytest.raises(ValueError, match="default_topk"):
        ServerLimits(default_topk=5, max_topk=3)


def test_client_skips_blank_queries_cuts_long_ones_and_splits_by_results(server, flat_retriever):
    c = HttpRetriever(server.url, retries=0, max_results_per_request=8, max_query_chars=1000)
    before = c.health()["requests"]
    qs = ["copper market", "   ", "plum wine", "x" * 5000, "white roofs"]
    got = c.search(qs, 4)               # 4 non-blank queries, 2 per request (8 results / k=4)
    assert c.health()["requests"] - before == 2        # /retrieve requests (health is not counted)
    assert got[1] == [] and all(len(r) == 4 for i, r in enumerate(got) if i != 1)
    local = flat_retriever.search(["copper market", "plum wine", "x" * 1000, "white roofs"], 4)
    assert [[p.id for p in r] for i, r in enumerate(got) if i != 1] == [[p.id for p in r] for r in local]


def test_large_request_is_sliced_and_small_ones_finish_first():
    """One request of 60 queries waiting with five one-query requests (all queued while a first
    batch computes): the small ones are served with the large one's first slice, not after it."""
    calls, done = [], []
    first = threading.Event()

    def search(queries, k):
        calls.append(list(queries))
        if len(calls) == 1:
            first.wait(10)   # hold the worker until everything below is queued
        return _fake_search(queries, k)

    async def main():
        b = MicroBatcher(search, max_wait_s=0.0, max_batch_queries=1000, slice_work=10 * 18, max_batch_work=1000)
        await b.start()
        large = [str(i) for i in range(100, 160)]          # work 3 + 16 = 19 each: 9 per slice of 180

        async def tracked(name, qs, k):
            out = await b.submit(qs, k)
            done.append(name)
            return out

        hold = asyncio.ensure_future(tracked("hold", ["99"], 1))
        while not calls:
            await asyncio.sleep(0.001)
        big = asyncio.ensure_future(tracked("large", large, 2))
        small = [asyncio.ensure_future(tracked(f"s{i}", [str(i)], 1)) for i in range(5)]
        await asyncio.sleep(0)
        first.set()
        out = await asyncio.gather(big, *small, hold)
        await b.stop()
        return out, b.stats

    out, stats = asyncio.run(main())
    assert done[-1] == "large" and set(done[1:-1]) == {f"s{i}" for i in range(5)}
    # one slice of the large one with the five; one more slice (their clients may be back); then,
    # with nobody to be fair to, the rest in one batch
    assert [len(c) for c in calls] == [1, 9 + 5, 9, 42] and stats.sliced_requests == 1
    assert sorted(calls[1][-5:]) == [str(i) for i in range(5)]
    np.testing.assert_array_equal(out[0][0], _fake_search([str(i) for i in range(100, 160)], 2)[0])
    for i, (ids, _) in enumerate(out[1:6]):
        np.testing.assert_array_equal(ids, _fake_search([str(i)], 1)[0])


def test_large_requests_without_small_ones_share_batches_whole():
    """Four 20-query requests (each four slices) and no small one: nobody to be fair to, so they
    are never cut; ``max_batch_queries`` splits them between batches by whole requests."""
    sizes = []

    def search(queries, k):
        sizes.append(len(queries))
        return _fake_search(queries, k)

    async def main():
        b = MicroBatcher(search, max_wait_s=0.01, max_batch_queries=50, slice_work=5 * 17, max_batch_work=10 * 17,
                         max_whole_work=10 ** 6)
        await b.start()
        reqs = [[str(100 * r + j) for j in range(20)] for r in range(4)]
        out = await asyncio.gather(*(b.submit(q, 1) for q in reqs))
        await b.stop()
        return reqs, out, b.stats

    reqs, out, stats = asyncio.run(main())
    assert sizes == [40, 40] and stats.sliced_requests == 0 and stats.fair_batches == 0
    for q, (ids, _) in zip(reqs, out):
        np.testing.assert_array_equal(ids, _fake_search(q, 1)[0])


def test_long_queries_are_not_padded_into_a_batch_of_short_ones():
    calls = []

    def search(queries, k):
        calls.append([len(q) for q in queries])
        return np.zeros((len(queries), k), np.int64), np.zeros((len(queries), k), np.float32)

    async def main():
        b = MicroBatcher(search, max_wait_s=0.01, max_batch_queries=1000, slice_work=400, max_batch_work=400)
        await b.start()
        long_req = b.submit(["x" * 300, "y" * 300], 1)
        out = await asyncio.gather(long_req, *(b.submit([str(i)], 1) for i in range(10)))
        await b.stop()
        return out

    out = asyncio.run(main())
    assert [len(ids) for ids, _ in out] == [2] + [1] * 10
    assert sorted(map(len, calls)) == [1, 1, 10]           # two slices of one long query, one batch of ten short
    assert all(max(c) < 300 or min(c) == 300 for c in calls)


class _Recording:
    """A retriever that records the torch threads of each search and the thread reading each row."""

    def __init__(self, inner):
        import torch

        self.inner, self.meta, self.kind, self.torch = inner, inner.meta, inner.kind, torch
        self.corpus = self
        self.searches: list[tuple[int, int]] = []
        self.row_threads: set[str] = set()

    def __len__(self):
        return len(self.inner)

    def search_rows(self, queries, k):
        self.searches.append((len(queries), self.torch.get_num_threads()))
        return self.inner.search_rows(queries, k)

    def document(self, row):
        self.row_threads.add(threading.current_thread().name)
        return self.inner.corpus.document(row)


def test_small_requests_search_on_one_thread_and_answer_on_the_loop(built):
    import torch

    rec = _Recording(open_retriever(built("bm25")))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with ServerThread(rec) as srv:
            c = HttpRetriever(srv.url, retries=0)
            small = c.search(["copper market"], 3)              # 3 passages: built on the event loop
            assert rec.searches == [(1, 1)] and rec.row_threads == {"retrieval-server"}
            rec.row_threads.clear()
            big = c.search([f"salt trade {i}" for i in range(20)], 5)   # 100 passages: an executor thread
            assert rec.searches[1] == (20, 2) and "retrieval-server" not in rec.row_threads
    finally:
        torch.set_num_threads(before)
    assert [p.id for p in small[0]] == [p.id for p in rec.inner.search(["copper market"], 3)[0]]
    assert len(big) == 20 and all(len(r) == 5 for r in big)
