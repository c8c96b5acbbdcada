"""SIGTERM saves like SIGINT."""

import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from mopd.train.interrupts import sigterm_as_interrupt


def _sigterm_self(spins: int, until=lambda: False) -> None:
    """Send this process SIGTERM and spin until ``until()`` (Python runs handlers between bytecodes)."""
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(spins):
        if until():
            break


def test_sigterm_inside_the_block_raises_keyboard_interrupt_once_then_restores():
    seen = []

    def previous(signum, frame):
        seen.append(signum)

    old = signal.signal(signal.SIGTERM, previous)
    try:
        with pytest.raises(KeyboardInterrupt), sigterm_as_interrupt() as received:
            _sigterm_self(10 ** 7)
        assert received == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is previous
        _sigterm_self(10 ** 6, until=lambda: seen)   # outside: the previous handler again
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, old)


def test_second_sigterm_while_handling_reaches_the_previous_handler():
    seen = []
    old = signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
    try:
        with sigterm_as_interrupt():
            try:
                _sigterm_self(10 ** 7)
            except KeyboardInterrupt:
                _sigterm_self(10 ** 6, until=lambda: seen)   # "writing the checkpoint" when the 2nd comes
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, old)


def test_disabled_or_off_the_main_thread_changes_nothing():
    before = signal.getsignal(signal.SIGTERM)
    with sigterm_as_interrupt(enabled=False):
        assert signal.getsignal(signal.SIGTERM) is before
    out = []

    def worker():
        with sigterm_as_interrupt():
            out.append(signal.getsignal(signal.SIGTERM))

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert out == [before]


CHILD = textwrap.dedent("""
    import sys, torch
    from transformers import AutoModelForCausalLM
    from mopd.train import checkpoint as ckpt
    from mopd.train.interrupts import sigterm_as_interrupt

    model_dir, run_dir = sys.argv[1], sys.argv[2]
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    step = 0
    try:
        with sigterm_as_interrupt():
            print("ready", flush=True)
            while True:
                ids = torch.randint(0, m.config.vocab_size, (1, 5))
                m(input_ids=ids, labels=ids).loss.backward()
                opt.step(); opt.zero_grad(); step += 1
    except KeyboardInterrupt:
        ckpt.save_checkpoint(run_dir, step, m, opt, {"model_path": model_dir})
        print("saved", step, flush=True)
        sys.exit(130)
""")


@pytest.mark.slow
def test_a_process_sent_sigterm_writes_a_verified_checkpoint(tiny_model_dir, tmp_path):
    from mopd.train.checkpoint import find_checkpoint

    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.Popen([sys.executable, "-c", CHILD, tiny_model_dir, str(tmp_path / "run")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert out.startswith("saved")
    path, skipped = find_checkpoint(tmp_path / "run")
    assert path is not None and not skipped
