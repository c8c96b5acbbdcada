"""A rank that dies ends the surviving ranks with one line naming it: after `kill -9` of
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
@pytest.mark.timeout(1200)
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
        while not (out / "checkpoints" / "step_000002" / "manifest.json").is_file():   # training for real
            assert proc.poll() is None, "the run ended before step 2"   # a hang: the test's timeout mark
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


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_killed_rank_of_a_data_parallel_evaluation_is_named_in_one_line(tiny_model_dir, tmp_path):
    """Two ranks of `mopd eval run` (started as torchrun would, without its agent: nothing else
    stops rank 0); rank 1 is killed after its first chunk, rank 0 meets the loss at the end meeting."""
    from mopd.core.qa import QAExample, write_questions

    manifest, out = tmp_path / "test.jsonl", tmp_path / "eval"
    write_questions(manifest, [QAExample(f"q{i}", "nq", f"Where was band {i} formed?", ["Paris"]) for i in range(12)])
    args = [sys.executable, "-m", "mopd", "eval", "run", "--model", tiny_model_dir, "--workflow", "cmas",
            "--manifest", str(manifest), "--attempts", "1", "--chunk", "1", "--out", str(out),
            f"retriever.index={small_index(tmp_path)}", "rollout.max_output_tokens=8", "rollout.max_steps=2"]
    port = str(free_port())
    procs = [subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=dict(
        os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
        MASTER_PORT=port, OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd(), CUDA_VISIBLE_DEVICES="")) for r in range(2)]
    try:
        part = out / "ranks" / "rank1-of-2" / "records.jsonl"
        while not (part.is_file() and part.stat().st_size > 0):
            assert procs[1].poll() is None, procs[1].stderr.read()[-3000:]   # a hang: the test's timeout mark
            time.sleep(0.1)
        procs[1].kill()
        _, err0 = procs[0].communicate(timeout=400)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert procs[0].returncode == 2 and "Traceback" not in err0, err0[-3000:]
    last = err0.replace("\r", "\n").strip().splitlines()[-1]
    assert last.startswith("mopd eval: error: rank 0 of 2: rank 1 died"), err0[-3000:]
    assert f"kept under {out}" in last and "run the same command again" in last, last
