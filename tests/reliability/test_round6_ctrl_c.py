"""Ctrl-C during `mopd demo`'s pi_0 warm start printed "mopd demo: interrupted" and then sat idle for
over 100 s (a second Ctrl-C gave three tracebacks): the warm start's demonstrations, pi_0's check
and the evaluations run in spawned workers (mopd.core.spawn_map), and an interrupted caller waited
for their jobs to end. Now the caller ends its workers at once, and they leave Ctrl-C to it (no
traceback of theirs), as `mopd train` and `mopd pipeline` stop: one line, exit 130."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# A job that does not stop on Ctrl-C (it swallows the KeyboardInterrupt, as code that records a
# failed run and goes on does), and a caller that maps it over spawned workers.
_JOBS = textwrap.dedent("""\
    import os, time
    from pathlib import Path

    def stubborn(folder):
        Path(folder, f"started-{os.getpid()}").write_text("")
        while True:   # never returns: only ending the worker stops it
            try:
                time.sleep(0.05)
            except KeyboardInterrupt:
                pass
    """)
_CALLER = textwrap.dedent("""\
    import sys
    from r6_jobs import stubborn
    from mopd.core.spawn_map import spawn_map

    if __name__ == "__main__":
        try:
            spawn_map(stubborn, [(sys.argv[1],)] * 5, 2)
        except KeyboardInterrupt:
            print("caller: interrupted", file=sys.stderr)
            sys.exit(130)
    """)


HANG_GUARD_S = 900.0
"""Only a guard against a hung test (CI would otherwise wait for its own limit): the behaviour under
test is whether the caller ends at all while its jobs never do, not how fast anything runs."""


def _wait_for(predicate, what: str, proc):
    end = time.monotonic() + HANG_GUARD_S
    while not predicate():
        assert proc.poll() is None, f"exited ({proc.returncode}) before {what}"
        if time.monotonic() > end:
            pytest.fail(f"hung: no {what} after {HANG_GUARD_S:g} s")
        time.sleep(0.1)


def _gone(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    return "\nState:\tZ" in status   # a zombie has ended (its parent reaps it)


@pytest.mark.parametrize("to", ["the process group", "the caller alone"])
def test_an_interrupted_spawn_map_ends_its_workers_at_once(tmp_path, to):
    (tmp_path / "r6_jobs.py").write_text(_JOBS)
    (tmp_path / "caller.py").write_text(_CALLER)
    flags = tmp_path / "flags"
    flags.mkdir()
    proc = subprocess.Popen([sys.executable, str(tmp_path / "caller.py"), str(flags)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])})
    try:
        _wait_for(lambda: len(list(flags.glob("started-*"))) == 2, "two running jobs", proc)
        workers = [int(f.name.split("-")[1]) for f in flags.glob("started-*")]
        if to == "the process group":
            os.killpg(proc.pid, signal.SIGINT)   # what Ctrl-C in a terminal does
        else:
            os.kill(proc.pid, signal.SIGINT)
        # the jobs never end: a caller that waits for them never returns, one that ends them does
        out, err = proc.communicate(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130 and err.strip() == "caller: interrupted", err[-3000:]
    assert all(_gone(pid) for pid in workers)
    assert len(list(flags.glob("started-*"))) == 2   # the jobs not started were cancelled


@pytest.mark.slow   # the quick demo's world and the start of its warm start: ~40 s on a loaded 2-core machine
def test_ctrl_c_during_the_demos_warm_start_stops_it_in_one_line(tmp_path):
    out = tmp_path / "demo"
    tag = f"r6-ctrl-c-{os.getpid()}-{time.monotonic_ns()}"   # finds the demo's processes, workers included
    proc = subprocess.Popen([sys.executable, "-m", "mopd", "demo", "--quick", "--bm25", "--out", str(out)],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT), "R6_TAG": tag})
    lines = []
    try:
        while True:   # until the warm start has begun building its demonstrations (in spawned workers)
            line = proc.stderr.readline()
            assert line, f"the demo ended ({proc.wait()}) before its warm start: {''.join(lines)[-3000:]}"
            lines.append(line)
            if "pi_0 warm start" in line:
                break
        _wait_for(lambda: len(_tagged(tag)) >= 2, "a demonstration worker", proc)
        time.sleep(1.0)   # the workers are running their jobs
        os.killpg(proc.pid, signal.SIGINT)
        _, rest = proc.communicate(timeout=HANG_GUARD_S)   # the demo sat idle here (over 100 s, then a 2nd Ctrl-C)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, rest[-3000:]
    assert "Traceback" not in rest and "KeyboardInterrupt" not in rest, rest[-3000:]
    assert [line for line in rest.splitlines() if "interrupted" in line] == ["mopd demo: interrupted"], rest[-3000:]
    assert not _tagged(tag)   # no worker outlives the demo
    assert not (out / "pi0" / "pi0.json").exists()


def _tagged(tag: str) -> list:
    """Live processes whose environment carries ``tag``."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if f"R6_TAG={tag}".encode() in (d / "environ").read_bytes() and not _gone(int(d.name)):
                    found.append(int(d.name))
            except OSError:
                pass
    return found
