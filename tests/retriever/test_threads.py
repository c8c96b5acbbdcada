"""ThreadsBySize: a batch of a few queries searches on one torch thread, larger ones on all, and the
process's thread count is back to what it was after every call (asserted by what the fake search
saw, never by time)."""

import numpy as np
import pytest
import torch

from mopd.retriever.threads import ThreadsBySize


class RecordingSearch:
    def __init__(self, fail=False):
        self.seen: list[tuple[int, int]] = []       # (queries, torch threads during the call)
        self.fail = fail

    def __call__(self, queries, k):
        self.seen.append((len(queries), torch.get_num_threads()))
        if self.fail:
            raise RuntimeError("index hiccup")
        return np.zeros((len(queries), k), np.int64), np.zeros((len(queries), k), np.float32)


@pytest.fixture
def three_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    yield
    torch.set_num_threads(before)


def test_small_batches_run_on_one_thread_and_large_ones_on_all(three_threads):
    rec = RecordingSearch()
    search = ThreadsBySize(rec, small=5, threads=1)
    for n in (1, 5, 6, 37, 2):
        ids, scores = search([f"q{i}" for i in range(n)], 3)
        assert ids.shape == scores.shape == (n, 3)
        assert torch.get_num_threads() == 3            # restored after every call
    assert rec.seen == [(1, 1), (5, 1), (6, 3), (37, 3), (2, 1)]
    assert search.limited == 3


def test_the_thread_count_is_restored_when_the_search_fails(three_threads):
    search = ThreadsBySize(RecordingSearch(fail=True), small=4, threads=2)
    with pytest.raises(RuntimeError, match="index hiccup"):
        search(["a", "b"], 1)
    assert torch.get_num_threads() == 3


def test_a_process_already_at_the_limit_is_left_alone():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rec = RecordingSearch()
        search = ThreadsBySize(rec, small=8, threads=2)   # asks for more than the process has: no change
        search(["a"], 1)
        assert rec.seen == [(1, 1)] and search.limited == 0
    finally:
        torch.set_num_threads(before)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        ThreadsBySize(RecordingSearch(), threads=0)
