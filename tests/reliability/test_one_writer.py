"""One writer per run directory, and no silent fresh start: a second `mopd train`
(`--resume` or not) or `mopd export` of a run in use is refused naming the holder's PID; the lock
goes with its process, even a killed one; `--resume` into a directory without a run is an error
that names `--resume-or-start`, which starts the run."""

import json
import os
import signal
import subprocess
import sys

import pytest

from mopd.cli import main
from mopd.core.run_lock import RunLock
from tests.reliability.runs import small_index, write_run


def _last_line(err: str) -> str:
    return err.replace("\r", "\n").strip().splitlines()[-1]


def _train_args(model, qa, out, *extra):
    return ["tiny_cmas_rl", f"model.path={model}", f"data.train={qa}", f"trainer.out_dir={out}", *extra]


@pytest.mark.parametrize("resume", [False, True])
def test_a_second_trainer_of_a_run_in_use_is_refused_naming_the_holder(tiny_model_dir, qa_file, tmp_path, capsys,
                                                                       resume):
    out = tmp_path / "run"
    write_run(out, tiny_model_dir, steps=(1,))
    with RunLock(out, "mopd train --resume"):
        before = sorted(p.name for p in out.iterdir())
        rc = main(["train", *(["--resume"] if resume else []), *_train_args(tiny_model_dir, qa_file, out)])
    err = _last_line(capsys.readouterr().err)
    assert rc == 2 and f"is in use by pid {os.getpid()} (mopd train --resume)" in err, err
    assert sorted(p.name for p in out.iterdir()) == before


def test_export_of_a_run_in_use_is_refused(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    write_run(out, tiny_model_dir, steps=(1,))
    capsys.readouterr()
    with RunLock(out, "mopd train"):
        assert main(["export", str(out), "--out", str(tmp_path / "hf")]) == 2
    assert f"in use by pid {os.getpid()}" in _last_line(capsys.readouterr().err)
    assert not (tmp_path / "hf").exists()
    assert main(["export", str(out), "--out", str(tmp_path / "hf")]) == 0    # free again once released


def test_the_lock_goes_with_a_killed_process(tmp_path):
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom mopd.core.run_lock import RunLock\n"
                               f"lock = RunLock({str(out)!r}, 'mopd train'); print('held', flush=True); time.sleep(600)"],
                              stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=os.getcwd()))
    try:
        assert holder.stdout.readline().strip() == "held"
        from mopd.core.run_lock import RunLocked

        with pytest.raises(RunLocked, match=f"pid {holder.pid} "):
            RunLock(out, "second")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    RunLock(out, "after the kill").release()


def test_resume_into_a_directory_without_a_run_is_an_error_naming_the_flag(tiny_model_dir, qa_file, tmp_path,
                                                                          capsys):
    out = tmp_path / "typo"
    rc = main(["train", "--resume", *_train_args(tiny_model_dir, qa_file, out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "holds no run to resume" in err and "--resume-or-start" in err, err
    assert not out.exists()


def test_resume_or_start_starts_a_run_then_resumes_it(tiny_model_dir, qa_file, tmp_path, capsys):
    out = tmp_path / "run"
    args = _train_args(tiny_model_dir, qa_file, out, f"retriever.index={small_index(tmp_path)}", "trainer.steps=1",
                       "trainer.questions_per_step=1", "rollout.group_size=2", "rollout.answer_candidates=1",
                       "rollout.max_output_tokens=6", "rollout.max_steps=2", "trainer.val_every=0",
                       "trainer.checkpoint_every=1")
    assert main(["train", "--resume-or-start", *args]) == 0
    assert json.loads((out / "run.json").read_text())["config"]["trainer.steps"] == 1
    assert (out / "checkpoints" / "step_000001").is_dir()
    capsys.readouterr()
    assert main(["train", "--resume-or-start", "--steps", "2", *args]) == 0
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines if "loss/total" in m] == [1, 2]
