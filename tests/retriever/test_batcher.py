"""MicroBatcher scheduling, asserted by which batches were formed (never by wall time): a fake
search records every batch and holds the worker on a gate, so the test decides what is waiting
when the next batch is taken."""

import asyncio
import threading

import numpy as np

from mopd.retriever.batcher import MicroBatcher


class GatedSearch:
    """Records each batch's queries; batch i (0-based) blocks until ``release(i)`` if ``hold`` has i."""

    def __init__(self, hold=()):
        self.calls: list[list[str]] = []
        self.gates = {i: threading.Event() for i in hold}

    def __call__(self, queries, k):
        i = len(self.calls)
        self.calls.append(list(queries))
        if i in self.gates:
            self.gates[i].wait(30)
        ids = np.array([[int(q) * 10 + j for j in range(k)] for q in queries], dtype=np.int64)
        return ids, -ids.astype(np.float32)

    async def started(self, n):
        """Until batch n-1 has been handed to the search (event ordering, not timing)."""
        while len(self.calls) < n:
            await asyncio.sleep(0.001)

    def release(self, i):
        self.gates[i].set()


def _queries(start, n):
    return [str(start + j) for j in range(n)]


def _check(out, reqs, k=1):
    for q, (ids, _) in zip(reqs, out, strict=True):
        assert ids.tolist() == [[int(x) * 10 + j for j in range(k)] for x in q]


def test_big_request_alone_runs_as_one_batch():
    """40 queries (work 3 + 16 = 19 each), 8 slices of 5 by the slice budget, and nothing else waiting: one batch."""
    search = GatedSearch()

    async def main():
        b = MicroBatcher(search, max_wait_s=0.5, slice_work=5 * 19, max_batch_work=10 * 19, max_whole_work=40 * 19)
        await b.start()
        req = _queries(100, 40)
        out = await b.submit(req, 1)
        out2 = await b.submit(_queries(200, 37), 1)   # and again, the same client
        await b.stop()
        return req, out, out2, b.stats

    req, out, out2, stats = asyncio.run(main())
    assert [len(c) for c in search.calls] == [40, 37]
    assert stats.sliced_requests == 0 and stats.fair_batches == 0 and stats.waits == 0
    _check([out, out2], [req, _queries(200, 37)])


def test_slicing_starts_when_a_small_request_waits_behind_a_big_one_and_stops_after():
    search = GatedSearch(hold=[0])

    async def main():
        b = MicroBatcher(search, max_wait_s=0.0, slice_work=5 * 19, max_batch_work=10 * 19, max_whole_work=40 * 19)
        await b.start()
        order = []

        async def tracked(name, qs):
            out = await b.submit(qs, 1)
            order.append(name)
            return out

        first = asyncio.ensure_future(tracked("first", _queries(900, 30)))   # big, alone: whole
        await search.started(1)
        big = asyncio.ensure_future(tracked("big", _queries(100, 40)))
        small = asyncio.ensure_future(tracked("small", ["7"]))
        await asyncio.sleep(0)
        search.release(0)
        out = await asyncio.gather(first, big, small)
        await b.stop()
        return out, order, b.stats

    out, order, stats = asyncio.run(main())
    # batch 1: the first request whole; batch 2: a slice of the big one + the small one; batch 3:
    # one more slice (the small client may be back); batch 4: nobody small around, the rest whole
    assert search.calls == [_queries(900, 30), _queries(100, 5) + ["7"], _queries(105, 5), _queries(110, 30)]
    assert order == ["first", "small", "big"]
    assert stats.fair_batches == 2 and stats.sliced_requests == 1
    _check(out, [_queries(900, 30), _queries(100, 40), ["7"]])


def test_small_request_ahead_of_a_big_one_is_not_held_by_it():
    """Order does not matter: a small request queued first does not take the big one whole along."""
    search = GatedSearch(hold=[0])

    async def main():
        b = MicroBatcher(search, max_wait_s=0.0, slice_work=5 * 19, max_batch_work=10 * 19)
        await b.start()
        hold = asyncio.ensure_future(b.submit(["1"], 1))
        await search.started(1)
        small = asyncio.ensure_future(b.submit(["2"], 1))
        big = asyncio.ensure_future(b.submit(_queries(100, 12), 1))
        await asyncio.sleep(0)
        search.release(0)
        await asyncio.gather(hold, small, big)
        await b.stop()

    asyncio.run(main())
    assert [len(c) for c in search.calls] == [1, 1 + 5, 5, 2]
    assert search.calls[1][0] == "2"


def test_big_requests_only_are_batched_whole():
    search = GatedSearch(hold=[0])

    async def main():
        b = MicroBatcher(search, max_wait_s=0.0, max_batch_queries=45, slice_work=5 * 19, max_batch_work=10 * 19,
                         max_whole_work=40 * 19)
        await b.start()
        first = asyncio.ensure_future(b.submit(_queries(900, 20), 1))
        await search.started(1)
        reqs = [_queries(100 * (r + 1), 20) for r in range(3)]
        rest = [asyncio.ensure_future(b.submit(q, 1)) for q in reqs]
        await asyncio.sleep(0)
        search.release(0)
        out = await asyncio.gather(*rest)
        await first
        await b.stop()
        return reqs, out, b.stats

    reqs, out, stats = asyncio.run(main())
    assert search.calls == [_queries(900, 20), reqs[0] + reqs[1], reqs[2]]  # whole requests, <= 45 queries
    assert stats.fair_batches == 0 and stats.sliced_requests == 0
    _check(out, reqs)


def test_window_waits_only_for_the_concurrency_last_seen():
    """A lone client never waits; after a batch of 8 requests, the worker waits for the 8th before
    taking the next batch (max_wait_s is long, so only the arrivals end the wait)."""
    search = GatedSearch()

    async def main():
        b = MicroBatcher(search, max_wait_s=30.0)
        await b.start()
        for i in range(3):                                   # one client, one request at a time
            await b.submit([str(i)], 1)
        lone_waits = b.stats.waits
        await asyncio.gather(*(b.submit([str(10 + i)], 1) for i in range(8)))   # 8 at once: one batch
        first3 = [asyncio.ensure_future(b.submit([str(20 + i)], 1)) for i in range(3)]
        for _ in range(5):
            await asyncio.sleep(0)                           # the worker is now waiting for more
        later5 = [asyncio.ensure_future(b.submit([str(23 + i)], 1)) for i in range(5)]
        await asyncio.gather(*first3, *later5)
        await b.stop()
        return lone_waits, b.stats

    lone_waits, stats = asyncio.run(main())
    assert lone_waits == 0
    assert [len(c) for c in search.calls] == [1, 1, 1, 8, 8] and stats.waits == 1


def test_no_wait_with_a_zero_window():
    search = GatedSearch()

    async def main():
        b = MicroBatcher(search, max_wait_s=0.0)
        await b.start()
        await asyncio.gather(*(b.submit([str(i)], 1) for i in range(4)))
        await asyncio.gather(b.submit(["5"], 1))
        await b.stop()
        return b.stats

    assert asyncio.run(main()).waits == 0 and [len(c) for c in search.calls] == [4, 1]


def test_a_request_above_the_whole_batch_cap_runs_in_pieces_even_alone():
    """Batches cannot be interrupted, so a huge request alone still runs in pieces of at most
    max_whole_work: a small request arriving meanwhile waits for one piece, not for all of it."""
    search = GatedSearch(hold=[0])

    async def main():
        b = MicroBatcher(search, max_wait_s=0.0, slice_work=5 * 19, max_batch_work=10 * 19, max_whole_work=20 * 19)
        await b.start()
        huge = asyncio.ensure_future(b.submit(_queries(100, 50), 1))
        await search.started(1)
        small = asyncio.ensure_future(b.submit(["7"], 1))
        await asyncio.sleep(0)
        search.release(0)
        out = await asyncio.gather(huge, small)
        await b.stop()
        return out

    out = asyncio.run(main())
    # a piece of 20 alone; then the small one with a slice of 5; one more slice; then pieces again
    assert search.calls == [_queries(100, 20), ["7"] + _queries(120, 5), _queries(125, 5), _queries(130, 20)]
    _check(out, [_queries(100, 50), ["7"]])


def test_by_default_a_big_request_alone_runs_in_pieces_of_one_batch():
    """The default whole-request cap is one batch's work: the first small client to arrive while a
    big request runs alone waits for one batch, not four (bench_retriever_latency.py's fairness)."""
    search = GatedSearch()

    async def main():
        b = MicroBatcher(search, max_wait_s=0.0, slice_work=5 * 19, max_batch_work=10 * 19)
        await b.start()
        out = await b.submit(_queries(100, 40), 1)
        await b.stop()
        return out, b.stats

    out, stats = asyncio.run(main())
    assert search.calls == [_queries(100 + 10 * i, 10) for i in range(4)]
    assert stats.fair_batches == 0 and stats.sliced_requests == 1
    _check([out], [_queries(100, 40)])


async def _big_and_small_behind_a_held_batch(b, search, big):
    """A one-query batch holds the worker while ``big`` and then the small request "2" queue; then
    the worker goes on. Returns the futures of (the held request, big, small)."""
    held = asyncio.ensure_future(b.submit(["1"], 1))
    await search.started(1)
    futures = asyncio.ensure_future(b.submit(big, 1)), asyncio.ensure_future(b.submit(["2"], 1))
    await asyncio.sleep(0)
    search.release(0)
    return (held, *futures)


def test_after_a_batch_with_small_requests_a_big_slice_waits_for_their_clients():
    """The small client answered in batch 2 sends its next request a while later: batch 3 is the big
    request's next slice WITH it (the return wait), not a slice alone that it would queue behind.
    max_wait_s is 0, so only the return wait can hold batch 3; it is 30 s, so only the arrival ends
    it. The big request's 7 queries left fill max_batch_queries: the wait must count its next slice
    (5), not all it has left, or it would never wait next to a request larger than a batch."""

    async def main(return_wait_s):
        search = GatedSearch(hold=[0])
        b = MicroBatcher(search, max_wait_s=0.0, max_batch_queries=7, slice_work=5 * 19, max_batch_work=10 * 19,
                         return_wait_s=return_wait_s)
        await b.start()
        held, big, small = await _big_and_small_behind_a_held_batch(b, search, _queries(100, 12))
        await small
        if return_wait_s == 0:
            await search.started(3)                 # without the wait: the big slice has gone alone
        else:
            await asyncio.sleep(0.05)               # the client's round trip
        again = await b.submit(["3"], 1)
        out = await big
        await held
        await b.stop()
        return search.calls, out, again, b.stats

    calls, out, again, stats = asyncio.run(main(30.0))
    assert calls == [["1"], _queries(100, 5) + ["2"], _queries(105, 5) + ["3"], _queries(110, 2)]
    # only batch 3 waited: the big request's last 2 queries fit one slice, so batch 4 did not
    assert stats.waits == 1
    _check([out, again], [_queries(100, 12), ["3"]])
    calls, _, _, _ = asyncio.run(main(0.0))
    assert calls[:3] == [["1"], _queries(100, 5) + ["2"], _queries(105, 5)]


def test_the_return_wait_is_bounded_and_never_holds_a_big_request_alone():
    """Nobody comes back: the big request's next slice waits out the return wait once, then runs;
    a big request that was alone in the last batch does not wait at all."""
    search = GatedSearch(hold=[0])

    async def main():
        b = MicroBatcher(search, max_wait_s=0.0, slice_work=5 * 19, max_batch_work=10 * 19, return_wait_s=0.02)
        await b.start()
        held, big, small = await _big_and_small_behind_a_held_batch(b, search, _queries(100, 30))
        out = await asyncio.gather(big, small, held)
        waits = b.stats.waits
        alone = await b.submit(_queries(200, 30), 1)
        await b.stop()
        return out, alone, waits, b.stats

    out, alone, waits, stats = asyncio.run(main())
    # batch 3 waited (for nobody), then the rest went in whole pieces (max_whole_work): nobody small around
    assert search.calls == [["1"], _queries(100, 5) + ["2"], _queries(105, 5), _queries(110, 10), _queries(120, 10),
                            _queries(200, 10), _queries(210, 10), _queries(220, 10)]
    assert waits == 1 and stats.waits == 1
    _check(out + [alone], [_queries(100, 30), ["2"], ["1"], _queries(200, 30)])


def test_a_negative_return_wait_is_refused():
    import pytest

    with pytest.raises(ValueError, match="return_wait_s"):
        MicroBatcher(GatedSearch(), return_wait_s=-0.001)
