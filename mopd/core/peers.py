"""Which rank died, when a collective fails because a peer is gone: one line instead of tracebacks.

When a rank of a torchrun launch dies (killed, out of memory, an error), every surviving rank's
next collective fails: gloo with "Connection reset by peer" from inside some all-reduce, NCCL with
an aborted communicator. On 8 or 64 ranks those tracebacks bury the one line that says which rank
died and why. So each rank records where it runs in the process group's store when it joins
(:func:`register_peer`: host, PID, local rank), and a rank whose collective fails asks
(:func:`lost_peer_line`): a peer on this host whose process is gone or a zombie is dead, and its
torchrun error file (beside this rank's ``TORCHELASTIC_ERROR_FILE``) says why when it wrote one.
Peers on other hosts cannot be checked from here: the line then quotes the collective's error.
Best effort throughout: nothing here may raise.

torch is imported inside the functions: the bottom layer stays importable without it.
"""

from __future__ import annotations

import json
import os
import socket
from datetime import timedelta
from pathlib import Path

from mopd.core.errors import UserError

PEER_KEY = "mopd/peer/{rank}"
PEER_LOSS_MARKERS = ("connection reset by peer", "connection closed by peer", "broken pipe", "connection refused",
                     "communicator was aborted", "remote process exited", "socket timeout")
"""Words of the errors a collective raises when a peer is gone (gloo, NCCL, the TCP store)."""


_joined: dict = {}
"""This rank's store, rank and world size, kept by :func:`register_peer`: a failed rank may have
left (destroyed) its process group before it asks who died."""


def register_peer() -> None:
    """Record this rank's host, PID and local rank in the process group's store (after joining)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() < 2:
        return
    try:
        from torch.distributed import distributed_c10d

        store = distributed_c10d._get_default_store()
        store.set(PEER_KEY.format(rank=dist.get_rank()),
                  json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                              "local_rank": int(os.environ.get("LOCAL_RANK", "0"))}))
    except Exception:  # noqa: BLE001 (a store without room for it: the line is then less precise)
        return
    _joined.update(store=store, rank=dist.get_rank(), world=dist.get_world_size())


def is_peer_loss(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is a collective that failed for a lost peer."""
    import torch.distributed as dist

    if not _joined:
        return False
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, dist.DistError):
            return True
        if isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in PEER_LOSS_MARKERS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _process_gone(pid: int) -> bool:
    """A PID of this host whose process has ended (gone, or a zombie its parent has not reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return False
    return stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X")


def _error_file_reason(local_rank: int) -> str | None:
    """The first line of the torchrun error file a local peer wrote (its uncaught exception)."""
    mine = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not mine:
        return None
    f = Path(mine).parent.parent / str(local_rank) / Path(mine).name
    try:
        message = json.loads(f.read_text())["message"]
        text = message.get("message", "") if isinstance(message, dict) else str(message)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    text = text.strip().splitlines()
    return text[0][:200] if text else None


def dead_peers() -> list[tuple[int, str]]:
    """``(rank, why)`` of every peer on this host that has died."""
    if not _joined:
        return []
    store = _joined["store"]
    try:
        store.set_timeout(timedelta(seconds=5))
    except Exception:  # noqa: BLE001
        return []
    me, host, dead = _joined["rank"], socket.gethostname(), []
    for rank in range(_joined["world"]):
        if rank == me:
            continue
        try:
            key = PEER_KEY.format(rank=rank)
            if not store.check([key]):
                continue
            info = json.loads(store.get(key))
        except Exception:  # noqa: BLE001 (the store itself went away)
            break
        if info.get("host") != host or not _process_gone(int(info.get("pid", 0))):
            continue
        why = _error_file_reason(int(info.get("local_rank", -1)))
        dead.append((rank, f"it ended: {why}" if why else f"its process {info.get('pid')} ended (killed, or "
                                                            "exited without an error file)"))
    return dead


def lost_peer_line(exc: BaseException) -> str | None:
    """One line naming the dead rank(s) when ``exc`` is a collective that lost a peer, else None."""
    if not is_peer_loss(exc):
        return None
    dead = dead_peers()
    if dead:
        lost = "; ".join(f"rank {r} died ({why})" for r, why in dead)
    else:
        said = str(exc).strip().splitlines()
        lost = f"a peer rank is gone (the collective said: {said[0][:200] if said else type(exc).__name__})"
    return f"rank {_joined['rank']} of {_joined['world']}: {lost}"


def raise_if_peer_lost(exc: BaseException, after: str) -> None:
    """A command's last word on a failure: when ``exc`` is a collective that lost a peer, a
    :class:`~mopd.core.errors.UserError` of :func:`lost_peer_line` and ``after`` (what is kept, what to
    run) instead of one traceback per surviving rank; otherwise it returns and the caller re-raises."""
    line = lost_peer_line(exc)
    if line is not None:
        raise UserError(f"{line}; {after}") from None
