"""The process group's life: join it (torchrun, or a one-process NCCL group on a lone GPU), all-reduce
over it, leave it, and end the process so that leaving cannot crash.

Why the ending needs care (measured on this repository's 2-rank CPU test, torch 2.13, gloo): after
a collective completes, the gloo worker thread that ran it still holds the work, and drops it a
moment later. When FSDP2 or DTensor handed that work tensors that Python had already let go of,
dropping it needs the GIL. If the main thread has meanwhile reached interpreter teardown, the
worker thread is killed while taking the GIL and the C++ runtime aborts the process ("terminate
called without an active exception", exit -6), after all the run's files were written. gdb shows
the worker in ``~AsyncAllgatherCoalescedWork`` -> ``take_gil`` -> ``pthread_exit``. The group
cannot simply be destroyed first: ``destroy_process_group`` unregisters it, but DTensor's sharding
caches keep device meshes, and each mesh keeps its groups, so the C++ group and its worker threads
live until teardown (pytorch/pytorch PR 179291 describes the same race and was abandoned).

So: ``leave_process_group`` waits at a barrier (every rank's collectives are done, and the GIL is
released while waiting, so pending drops can run) and destroys the group; a process that used a
multi-rank gloo group then ends through ``end_process``, which flushes what Python buffers and
exits without interpreter teardown. NCCL groups keep the normal exit: their ``shutdown`` (called
by ``destroy_process_group``) drains in-flight work and tells the watchdog to flush its queue
(verified by reading ProcessGroupNCCL.cpp; some versions say they do not join the threads there).
Whether a GPU run can hit the same race was not measured (no GPU lent); if one aborts at exit
after its files are written, widen ``leave_process_group``'s condition to NCCL.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from typing import Callable, Optional

import torch
import torch.distributed as dist

from mopd.core.peers import register_peer

_workers_may_outlive_group = False
"""Set when this process left a multi-rank gloo group (see the module docstring)."""


def init_distributed() -> bool:
    """Join the torchrun process group when launched by torchrun (gloo on CPU, NCCL on CUDA).

    On a GPU without torchrun this starts a one-process NCCL group, so that a single-GPU run takes
    the same path as a multi-GPU one: FSDP2 with fp32 master weights and bf16 compute, and vLLM
    through its external launcher. (On CPU a single process stays unsharded, in fp32.)
    Returns whether this call started the group (its owner should leave it).
    """
    if dist.is_initialized():
        return False
    cuda = torch.cuda.is_available()
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        if not cuda:
            return False
        for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}.items():
            os.environ.setdefault(key, value)
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    register_peer()   # so that a rank that loses a peer can say which one died
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_and_world() -> tuple[int, int]:
    """This process's rank and the number of ranks (0, 1 without a process group)."""
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_reduce(x: torch.Tensor, op=None) -> torch.Tensor:
    """Sum (or ``op``) ``x`` in place over the ranks; ``x`` itself without a process group."""
    if dist.is_initialized():
        dist.all_reduce(x, op=op or dist.ReduceOp.SUM)
    return x


def leave_process_group(*, wait_for_peers: bool = True, before_destroy: Optional[Callable[[], None]] = None) -> None:
    """Destroy the default group, after a barrier when ``wait_for_peers`` (a clean end, reached by
    every rank; a rank that failed must not wait for peers that may never arrive).

    ``before_destroy`` runs after the barrier, while the group is still alive: the teardown of
    what was built on it (vLLM's engine destroys its own groups, which need the default one, and
    then the default group itself, which is why it may be gone afterwards)."""
    global _workers_may_outlive_group
    if not dist.is_initialized():
        if before_destroy is not None:
            before_destroy()
        return
    if dist.get_backend() == "gloo" and dist.get_world_size() > 1:
        _workers_may_outlive_group = True
    if wait_for_peers:
        dist.barrier()
    if before_destroy is not None:
        before_destroy()
    if dist.is_initialized():
        dist.destroy_process_group()


def end_process(code: int) -> None:
    """Exit with ``code``. After a multi-rank gloo group, exit without interpreter teardown (flushing
    logs and standard streams first), which is the one way its worker threads cannot abort the exit;
    otherwise a normal ``sys.exit``. Call it last, after every file is closed."""
    if not _workers_may_outlive_group:
        sys.exit(code)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):   # a closed or broken pipe: nothing left to keep
            pass
    os._exit(code)
