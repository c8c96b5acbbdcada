"""Every write failure of a checkpoint save is one line naming the checkpoint and the cause, with the
previous checkpoints intact and the run resumable: a file-size limit (``ulimit -f``: EFBIG, which
torch's zip writer reports as "unexpected pos ..."), a failing or read-only disk, as a full disk
already was (tests/reliability/test_disk_space.py)."""

import errno
import resource
import signal
from contextlib import contextmanager

import pytest
import torch

from mopd.train import checkpoint as ckpt


@contextmanager
def _file_size_limit(limit: int):
    """``ulimit -f`` for this process meanwhile, with SIGXFSZ ignored (as a shell that ran the
    command under a limit and a trap would): a write past the limit then fails with EFBIG."""
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, old_limit[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)


@pytest.fixture(scope="module")
def trainer_at_step_one(tiny_model_dir, qa_file, tmp_path_factory):
    """A trainer that has saved checkpoint step 1 and is about to save step 2 (shared: a save that
    fails changes nothing in it); (trainer, config, run directory)."""
    from mopd.config import resolve
    from mopd.train.trainer import PolicyTrainer
    from tests.helpers.retrievers import FakeRetriever
    from tests.helpers.training import tiny_overrides

    run_dir = tmp_path_factory.mktemp("save_failures") / "run"
    cfg = resolve("cmas_rl", tiny_overrides(tiny_model_dir, qa_file, run_dir, **{
        "trainer.checkpoint_every": 1, "trainer.steps": 3, "trainer.questions_per_step": 1,
        "rollout.max_output_tokens": 6}))
    t = PolicyTrainer(cfg, retriever=FakeRetriever(), progress=False)
    try:
        t.fit(1)
        t.step = 2   # the next save (a training step changes nothing the save does)
        yield t, cfg, run_dir
    finally:
        t.close()


def _assert_intact(run_dir):
    path, skipped = ckpt.find_checkpoint(run_dir)
    assert path.name == "step_000001" and not skipped
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step_")) == ["step_000001"]


def _assert_resumable(cfg, run_dir):
    from mopd.train.trainer import PolicyTrainer
    from tests.helpers.retrievers import FakeRetriever

    _assert_intact(run_dir)
    resumed = PolicyTrainer(cfg, retriever=FakeRetriever(), progress=False, resume=True)
    try:
        assert resumed.step == 1
    finally:
        resumed.close()


def test_a_file_size_limit_during_a_save_is_one_line_and_the_run_resumes(trainer_at_step_one):
    from mopd.train.trainer import TrainingError

    t, cfg, run_dir = trainer_at_step_one
    one = sum(f.stat().st_size for f in ckpt.latest_checkpoint(run_dir).rglob("*.distcp"))
    limit = max(one // 4, 4096)   # well below the weights' file, above every small file the save writes
    with _file_size_limit(limit), pytest.raises(TrainingError) as e:
        t.save()
    msg = str(e.value)
    assert "\n" not in msg, msg
    assert msg.startswith(f"checkpoint {run_dir / 'checkpoints' / 'step_000002'} could not be written: "), msg
    assert f"at most {limit} bytes (ulimit -f / RLIMIT_FSIZE)" in msg, msg
    assert msg.endswith("the previous checkpoint step_000001 is intact (--resume continues from it)"), msg
    _assert_resumable(cfg, run_dir)


@pytest.mark.parametrize("code", [errno.EIO, errno.EROFS])
def test_any_other_write_failure_of_a_save_is_the_same_one_line(trainer_at_step_one, monkeypatch, code):
    import os

    from mopd.train.trainer import TrainingError

    t, cfg, run_dir = trainer_at_step_one
    failing = run_dir / "checkpoints" / "step_000002.tmp" / "rng_rank0.pt"

    def refuse(obj, f, *a, **k):
        raise OSError(code, os.strerror(code), str(failing))

    monkeypatch.setattr(torch, "save", refuse)   # after DCP wrote the weights: the RNG file fails
    with pytest.raises(TrainingError) as e:
        t.save()
    monkeypatch.undo()
    msg = str(e.value)
    assert msg == (f"checkpoint {run_dir / 'checkpoints' / 'step_000002'} could not be written: {os.strerror(code)} "
                   f"({failing}) [{errno.errorcode[code]}]; the previous checkpoint step_000001 is intact (--resume "
                   "continues from it)")
    _assert_intact(run_dir)
