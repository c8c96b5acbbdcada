"""Joining, using and leaving the process group, and ending the process (mopd.train.distributed)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist

from mopd.train import distributed
from tests.train.test_distributed import free_port

RANK_SCRIPT = textwrap.dedent("""
    import sys, torch
    from mopd.train.distributed import all_reduce, end_process, init_distributed, leave_process_group, rank_and_world
    assert init_distributed()
    rank, world = rank_and_world()
    x = torch.tensor([float(v) for v in sys.argv[1].split(",")]) * (rank + 1)
    all_reduce(x)
    mx = all_reduce(torch.tensor([rank * 10 + 3]), torch.distributed.ReduceOp.MAX)
    print(f"rank {rank}/{world} sum {x.tolist()} max {int(mx)}", end="")   # no newline: left in the buffer
    leave_process_group()
    end_process(int(sys.argv[2]))
    print("unreachable")
""")


@pytest.mark.slow
def test_two_gloo_ranks_reduce_leave_and_end_with_the_code_and_their_output(tmp_path):
    """What a torchrun worker does: the sums are right, and ending after a multi-rank gloo group
    (no interpreter teardown) still returns the given code and flushes what was printed."""
    values = torch.randn(5, generator=torch.Generator().manual_seed(3)).tolist()
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port, OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd())
        env.pop("PYTHONUNBUFFERED", None)                   # a pipe's output stays buffered until flushed
        procs.append(subprocess.Popen([sys.executable, str(script), ",".join(map(str, values)), "7"],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [7, 7], [err[-2000:] for _, err in outs]
    expected = [round(3 * v, 4) for v in values]           # rank 0 adds 1x, rank 1 adds 2x
    for rank, (out, _) in enumerate(outs):
        head, sums = out.split(" sum ")
        assert head == f"rank {rank}/2" and "unreachable" not in out
        got, mx = sums.split(" max ")
        assert [round(v, 4) for v in json.loads(got)] == expected and int(mx) == 13


def test_without_a_group_everything_is_local_and_the_exit_is_a_normal_one():
    assert not dist.is_initialized()
    assert distributed.rank_and_world() == (0, 1)
    x = torch.randn(4)
    assert distributed.all_reduce(x.clone()).equal(x)
    distributed.leave_process_group()                       # nothing to leave: no error
    with pytest.raises(SystemExit) as e:
        distributed.end_process(5)
    assert e.value.code == 5


def test_a_one_rank_gloo_group_is_left_and_the_process_ends_normally(tmp_path):
    """One rank: its threads go with the group, so no teardown-free exit is needed."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert distributed.rank_and_world() == (0, 1)
        assert distributed.all_reduce(torch.tensor([2.5])).item() == 2.5
    finally:
        distributed.leave_process_group(wait_for_peers=False)
    assert not dist.is_initialized() and not distributed._workers_may_outlive_group
    with pytest.raises(SystemExit):
        distributed.end_process(0)


@pytest.mark.parametrize("engine_destroys_the_group", [False, True])
def test_leaving_runs_the_engine_teardown_while_the_group_is_alive(tmp_path, engine_destroys_the_group):
    """vLLM's teardown destroys its own groups (built on the default one), then the default group."""
    assert not dist.is_initialized()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    seen = []

    def teardown():
        seen.append(dist.is_initialized())
        if engine_destroys_the_group:
            dist.destroy_process_group()

    distributed.leave_process_group(before_destroy=teardown)
    assert seen == [True] and not dist.is_initialized()
