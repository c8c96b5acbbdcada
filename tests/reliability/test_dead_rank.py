"""A rank that dies ends the surviving ranks with one line naming it (issue 48): after `kill -9` of
rank 1 of a 2-rank `mopd train` under torchrun, rank 0 said nothing but a gloo traceback from an
all-reduce; now its last line names rank 1 and the checkpoint to resume from, with no traceback."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.training import tiny_overrides
from tests.reliability.runs import small_index
from tests.train.test_distributed import free_port


def _rank_pid(port: int, rank: int) -> int | None:
    """The PID of torchrun's worker ``rank`` of the launch on ``port`` (from the workers' environments)."""
    want = {f"RANK={rank}".encode(), f"MASTER_PORT={port}".encode()}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = set((d / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if want <= env and any(e.startswith(b"LOCAL_RANK=") for e in env):
            return int(d.name)
    return None


@pytest.mark.slow
def test_a_killed_rank_is_named_in_one_line_by_the_survivor(tiny_model_dir, qa_file, tmp_path):
    out, logs, port = tmp_path / "run", tmp_path / "logs", free_port()
    overrides = tiny_overrides(tiny_model_dir, qa_file, out, **{
        "trainer.steps": 400, "trainer.checkpoint_every": 1, "trainer.keep_checkpoints": 2,
        "retriever.index": str(small_index(tmp_path))})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(port), "--redirects", "3", "--log-dir", str(logs), "-m", "mopd", "train", "cmas_rl",
           *overrides]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(
        os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=os.getcwd()))
    try:
        deadline = time.monotonic() + 400
        while not (out / "checkpoints" / "step_000002" / "manifest.json").is_file():   # training for real
            assert proc.poll() is None and time.monotonic() < deadline, "the run did not reach step 2"
            time.sleep(0.2)
        pid = _rank_pid(port, 1)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        assert proc.wait(timeout=120) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
    err0 = next(logs.rglob("attempt_0/0/stderr.log")).read_text()
    assert "Traceback" not in err0, err0[-3000:]
    last = err0.replace("\r", "\n").strip().splitlines()[-1]
    if "interrupted" in last:       # torchrun's SIGTERM reached rank 0 before its next collective did
        pytest.skip(f"rank 0 was stopped by torchrun first: {last}")
    assert last.startswith("mopd train: error: rank 0 of 2: rank 1 died"), err0[-3000:]
    assert "the newest intact checkpoint is" in last and "step_0000" in last and "--resume" in last, last
