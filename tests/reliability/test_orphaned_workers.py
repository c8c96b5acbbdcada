"""A pipeline killed with ``kill -9`` leaves no worker behind, and no stage is marked done by a
process whose pipeline is gone. Before: `mopd demo --quick` killed during Stage II left its worker
processes running; they finished, marked both Stage II stages done after their pipeline was gone,
and the rerun reused what the orphans wrote."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mopd.core.run_lock import RunLock
from mopd.pipeline.owner import OWNER_ENV, OrphanedStage, check_live_owner, hold, lock_holder
from mopd.pipeline.stages import DONE, ReportStage

WORKERS = textwrap.dedent("""
    import os, sys, time
    from mopd.core.spawn_map import spawn_map

    def sleeper(d, i):
        with open(f"{d}/w{i}.tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(f"{d}/w{i}.tmp", f"{d}/w{i}")
        time.sleep(600)
        open(f"{d}/finished{i}", "w").close()

    if __name__ == "__main__":
        spawn_map(sleeper, [(sys.argv[1], i) for i in range(3)], 3)
""")


def _gone(pid: int) -> bool:
    """Ended (or a zombie waiting for a parent that reaps nothing, as PID 1 in some containers)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def _wait(condition, within_s=120.0):
    """Poll ``condition`` (a generous bound, never a timing assertion); its last value."""
    end = time.monotonic() + within_s
    while not (ok := condition()) and time.monotonic() < end:
        time.sleep(0.2)
    return ok


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_end_when_their_parent_is_killed_with_sigkill(tmp_path):
    script = tmp_path / "workers.py"
    script.write_text(WORKERS)
    parent = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=dict(os.environ, PYTHONPATH=os.getcwd()))
    workers = []
    try:
        assert _wait(lambda: all((tmp_path / f"w{i}").is_file() for i in range(3)) or parent.poll() is not None)
        assert parent.poll() is None, "the parent ended before its workers started"
        workers = [int((tmp_path / f"w{i}").read_text()) for i in range(3)]
        assert not any(_gone(p) for p in workers)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert _wait(lambda: all(_gone(p) for p in workers)), [p for p in workers if not _gone(p)]
        assert not list(tmp_path.glob("finished*"))
    finally:
        for p in workers:        # the workers are ours to end if the test failed
            if not _gone(p):
                os.kill(p, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()


def _report_stage(tmp_path):
    out = tmp_path / "report"
    out.mkdir()
    return ReportStage(key="report", group="report", title="the report", outputs=[str(out)])


def test_a_stage_is_marked_done_by_its_live_pipeline_holding_the_lock(tmp_path, monkeypatch):
    monkeypatch.delenv(OWNER_ENV, raising=False)
    stage = _report_stage(tmp_path)
    stage.mark_done()                               # outside a pipeline: nothing to check
    (stage.out / DONE).unlink()
    with RunLock(tmp_path / "root", "mopd pipeline test") as lock, hold(lock):
        assert lock_holder(lock.path) == os.getpid()
        stage.mark_done()
        assert (stage.out / DONE).is_file()
    assert OWNER_ENV not in os.environ


def test_without_the_lock_a_stage_is_not_marked_done(tmp_path):
    stage = _report_stage(tmp_path)
    lock = RunLock(tmp_path / "root", "mopd pipeline test")
    with hold(lock):
        lock.release()              # the kernel dropped it (its process was killed) or a rerun took it
        assert lock_holder(lock.path) is None
        with pytest.raises(OrphanedStage, match="no longer holds .*no process holds it"):
            stage.mark_done()
    assert not (stage.out / DONE).exists()


def _dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


ORPHAN = textwrap.dedent("""
    import sys
    from mopd.pipeline.owner import OrphanedStage
    from mopd.pipeline.stages import ReportStage
    stage = ReportStage(key="stage2.opd", group="stage2", title="t", outputs=[sys.argv[1]])
    try:
        stage.mark_done()
        print("marked")
    except OrphanedStage as e:
        print("refused:", e)
""")


@pytest.mark.parametrize("owner", ["this process, holding the lock", "a dead pipeline", "a rerun holding the lock"])
def test_a_worker_marks_a_stage_done_only_for_its_live_parent(tmp_path, owner):
    out = tmp_path / "report"
    out.mkdir()
    with RunLock(tmp_path / "root", "mopd pipeline test") as lock:
        pid = {"this process, holding the lock": os.getpid(), "a dead pipeline": _dead_pid(),
               "a rerun holding the lock": os.getpid()}[owner]
        env = dict(os.environ, PYTHONPATH=os.getcwd(), **{OWNER_ENV: json.dumps({"pid": pid, "lock": str(lock.path)})})
        if owner == "a rerun holding the lock":      # the worker's pipeline is another, gone, process
            env[OWNER_ENV] = json.dumps({"pid": _dead_pid(), "lock": str(lock.path)})
        said = subprocess.run([sys.executable, "-c", ORPHAN, str(out)], env=env, capture_output=True, text=True,
                              timeout=300)
    assert said.returncode == 0, said.stderr
    if owner == "this process, holding the lock":
        assert said.stdout.strip() == "marked" and (out / DONE).is_file()
    else:
        assert said.stdout.startswith("refused: stage stage2.opd is not marked done: the pipeline that started it")
        assert not (out / DONE).exists()


def test_check_live_owner_by_hand(tmp_path, monkeypatch):
    lock = RunLock(tmp_path / "root", "mopd pipeline test")
    try:
        monkeypatch.setenv(OWNER_ENV, json.dumps({"pid": _dead_pid(), "lock": str(lock.path)}))
        with pytest.raises(OrphanedStage, match=r"stage x is not marked done: .* \(pid \d+\) is gone"):
            check_live_owner("x")
        monkeypatch.setenv(OWNER_ENV, json.dumps({"pid": os.getpid(), "lock": str(lock.path)}))
        check_live_owner("x")
    finally:
        lock.release()
