"""A full disk: the run directory needs room for a checkpoint before the first step,
and a save that runs out of space says "no space left on DEVICE: N MB needed, the previous
checkpoint STEP is intact" instead of torch's zip-writer error, leaving the previous one intact.

The disk is simulated: a 12 MB tmpfs needs root and a mount, so the writer (torch.save) is made
to fail as it does on a full disk, and ``shutil.disk_usage`` reports the free space."""

import errno
import shutil
from collections import namedtuple

import pytest
import torch

from mopd.cli import main
from mopd.train import checkpoint as ckpt
from mopd.train.disk_space import MB, checkpoint_bytes

Usage = namedtuple("Usage", "total used free")


def _free(monkeypatch, free_bytes):
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(1 << 40, (1 << 40) - free_bytes, free_bytes))


def test_the_checkpoint_estimate_is_twelve_bytes_a_parameter(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    n = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(tiny_model_dir).parameters())
    est = checkpoint_bytes(tiny_model_dir)
    assert 12 * n <= est <= 12 * n * 1.1 + 2 * MB     # fp32 weights + AdamW's two moments (+ small files)


def test_a_full_run_directory_is_refused_before_training(tiny_model_dir, qa_file, tmp_path, capsys, monkeypatch):
    _free(monkeypatch, 100 << 10)
    out = tmp_path / "run"
    rc = main(["train", "tiny_cmas_rl", f"model.path={tiny_model_dir}", f"data.train={qa_file}",
               f"trainer.out_dir={out}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "MB free on" in err and "one checkpoint needs about" in err, err
    assert not out.exists()


@pytest.mark.parametrize("failure", ["zip writer", "ENOSPC"])
def test_a_save_that_fills_the_disk_names_it_and_keeps_the_previous_checkpoint(tiny_model_dir, qa_file, tmp_path,
                                                                              monkeypatch, failure):
    from mopd.config import resolve
    from mopd.train.trainer import PolicyTrainer, TrainingError
    from tests.helpers.retrievers import FakeRetriever
    from tests.helpers.training import tiny_overrides

    cfg = resolve("cmas_rl", tiny_overrides(tiny_model_dir, qa_file, tmp_path / "run", **{
        "trainer.checkpoint_every": 1, "trainer.steps": 3, "trainer.questions_per_step": 1,
        "rollout.max_output_tokens": 6}))
    t = PolicyTrainer(cfg, retriever=FakeRetriever(), progress=False)
    try:
        t.fit(1)
        real_save = torch.save

        def full_disk(obj, f, *a, **k):
            if failure == "ENOSPC":
                raise OSError(errno.ENOSPC, "No space left on device")
            _free(monkeypatch, 10 << 10)    # what torch's zip writer leaves when the disk fills
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

        monkeypatch.setattr(torch, "save", full_disk)
        t.step = 2          # the next save (a training step changes nothing the save does)
        with pytest.raises(TrainingError) as e:
            t.save()
        monkeypatch.setattr(torch, "save", real_save)
    finally:
        t.close()
    msg = str(e.value)
    assert msg.startswith("no space left on ") and "MB needed, the previous checkpoint step_000001 is intact" in msg
    assert "\n" not in msg
    path, skipped = ckpt.find_checkpoint(tmp_path / "run")
    assert path.name == "step_000001" and not skipped
    assert not list((tmp_path / "run" / "checkpoints").glob("*.tmp"))   # the partial save gave its space back


def test_other_save_errors_are_not_called_a_full_disk(tiny_model_dir, qa_file, tmp_path, monkeypatch):
    from mopd.config import resolve
    from mopd.train.trainer import PolicyTrainer
    from tests.helpers.retrievers import FakeRetriever
    from tests.helpers.training import tiny_overrides

    cfg = resolve("cmas_rl", tiny_overrides(tiny_model_dir, qa_file, tmp_path / "run"))
    t = PolicyTrainer(cfg, retriever=FakeRetriever(), progress=False)

    def broken(*a, **k):
        raise RuntimeError("some other writer bug")

    monkeypatch.setattr(torch, "save", broken)
    try:
        with pytest.raises(BaseException, match="some other writer bug"):   # as raised (DCP wraps it)
            t.save()
    finally:
        t.close()
