"""spawn_map: one function over argument tuples in spawned processes, results in input order."""

import pytest

from mopd.core.spawn_map import spawn_map


def _power(base, exp):
    import os

    return base ** exp, os.getpid()


def _fails(x):
    raise ValueError(f"bad input {x}")


def test_results_come_back_in_input_order_from_other_processes():
    import os

    jobs = [(7, 3), (2, 11), (5, 0), (3, 5), (13, 2)]
    out = spawn_map(_power, jobs, workers=2)
    assert [v for v, _ in out] == [343, 2048, 1, 243, 169]
    assert all(pid != os.getpid() for _, pid in out)


def test_a_worker_error_is_raised_in_the_caller():
    with pytest.raises(ValueError, match="bad input 4"):
        spawn_map(_fails, [(4,)], workers=1)
