"""WorkQueue.take_fitting: the one row-capped take under the engine fronts."""

import pytest

from mopd.rollout.work_queue import FrontClosed, WorkQueue


def _sizes(items):
    return [item for item, _, _ in items]


def test_take_fitting_is_oldest_first_up_to_the_cap_and_an_oversized_item_goes_alone():
    q = WorkQueue("request")
    futures = [q.submit(n) for n in (3, 4, 2, 9, 1)]
    with q._cv:
        assert q.pending_size(int) == 19
        assert _sizes(q.take_fitting(8, size=int)) == [3, 4]          # 3 + 4 + 2 > 8: stop before 2
        assert _sizes(q.take_fitting(8, size=int, used=5)) == [2]     # 5 rows run already: 2 fits, 9 does not
        assert _sizes(q.take_fitting(8, size=int, used=7)) == []      # nothing fits beside 7
        assert _sizes(q.take_fitting(8, size=int)) == [9]             # nothing runs: the oversized item alone
        assert _sizes(q.take_fitting(8, size=int)) == [1]
        assert q.take_fitting(8, size=int) == [] and q.pending_size(int) == 0
    assert all(f.running() for f in futures)                         # taken items are marked running


def test_take_fitting_drops_items_whose_waiter_went_away_without_counting_them():
    q = WorkQueue("request")
    a, b, c = q.submit(5), q.submit(5), q.submit(2)
    assert b.cancel()
    with q._cv:
        assert q.pending_size(int) == 7                              # the cancelled 5 is not pending work
        taken = q.take_fitting(7, size=int)
    assert _sizes(taken) == [5, 2] and b.cancelled()                 # the cancelled 5 took no room
    assert taken[0][1] is a and taken[1][1] is c


def test_closed_queue_fails_what_never_ran_and_refuses_new_work():
    q = WorkQueue("search")
    f = q.submit("query")
    q.close_pending()
    with pytest.raises(FrontClosed, match="before this search ran"):
        f.result(timeout=1)
    with pytest.raises(FrontClosed, match="cannot run"):
        q.submit("late")
