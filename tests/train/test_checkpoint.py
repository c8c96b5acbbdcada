"""Checkpoints carry a manifest; damaged ones are skipped for the newest one that verifies.

Every test corrupts real checkpoint files of the tiny model (truncate, delete, flip bytes, a save
killed half way) and checks what loading then does.
"""

import json
import os
from pathlib import Path

import pytest
import torch

from mopd.train import checkpoint as ckpt
from mopd.train.manifest import MANIFEST, verify_checkpoint
from tests.helpers.checkpoints import model_and_optimizer, train_a_bit


def _params(m):
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


@pytest.fixture()
def run(tiny_model_dir, tmp_path):
    """A run with checkpoints at steps 1, 2, 3 (different weights each); returns (dir, weights per step)."""
    m, opt = model_and_optimizer(tiny_model_dir)
    weights = {}
    for step in (1, 2, 3):
        train_a_bit(m, opt, step)
        ckpt.save_checkpoint(tmp_path / "run", step, m, opt, {"model_path": tiny_model_dir}, keep=5)
        weights[step] = _params(m)
    return tmp_path / "run", weights


def _step(run_dir, n):
    return run_dir / "checkpoints" / f"step_{n:06d}"


def _distcp(path):
    return min(path.glob("*.distcp"))


def _load_into_fresh(model_dir, run_dir):
    m, opt = model_and_optimizer(model_dir)
    skipped = []
    path, state = ckpt.load_latest(run_dir, m, opt, on_skip=lambda p, why: skipped.append((p.name, why)))
    return m, path, state, skipped


def _same(m, weights):
    got = _params(m)
    return all(torch.equal(got[k], weights[k]) for k in weights)


def test_manifest_lists_every_file_with_size_and_checksum(run):
    run_dir, _ = run
    path = _step(run_dir, 3)
    files = json.loads((path / MANIFEST).read_text())["files"]
    on_disk = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file() and p.name != MANIFEST)
    assert sorted(files) == on_disk
    assert {"trainer_state.json", ".metadata", "rng_rank0.pt"} <= set(files)
    assert all(files[n]["size"] == (path / n).stat().st_size and len(files[n]["sha256"]) == 64 for n in files)
    assert verify_checkpoint(path) is None
    assert json.loads((path / "trainer_state.json").read_text())["format"] == 2


def _truncate(p: Path):
    with p.open("r+b") as f:
        f.truncate(p.stat().st_size // 2)


def _flip(p: Path):
    data = bytearray(p.read_bytes())
    mid = len(data) // 2
    for i in range(mid, mid + 16):
        data[i] ^= 0xFF
    p.write_bytes(bytes(data))


DAMAGE = [
    ("truncated distcp", lambda s: _truncate(_distcp(s)), "truncated"),
    ("deleted distcp", lambda s: _distcp(s).unlink(), "missing"),
    ("flipped distcp", lambda s: _flip(_distcp(s)), "sha256"),
    ("truncated metadata", lambda s: _truncate(s / ".metadata"), "truncated"),
    ("deleted metadata", lambda s: (s / ".metadata").unlink(), "missing"),
    ("truncated rng", lambda s: _truncate(s / "rng_rank0.pt"), "truncated"),
    ("deleted rng", lambda s: (s / "rng_rank0.pt").unlink(), "missing"),
    ("truncated trainer_state", lambda s: _truncate(s / "trainer_state.json"), "truncated"),
    ("deleted trainer_state", lambda s: (s / "trainer_state.json").unlink(), "missing"),
    ("save killed before the manifest", lambda s: (s / MANIFEST).unlink(), "no manifest"),
    ("garbled manifest", lambda s: (s / MANIFEST).write_text("{not json"), "unreadable manifest"),
]


@pytest.mark.parametrize("damage,why", [(d, w) for _, d, w in DAMAGE], ids=[n for n, _, _ in DAMAGE])
def test_damaged_newest_checkpoint_falls_back_to_the_previous_one(run, tiny_model_dir, damage, why):
    run_dir, weights = run
    damage(_step(run_dir, 3))
    m, path, state, skipped = _load_into_fresh(tiny_model_dir, run_dir)
    assert path == _step(run_dir, 2) and state["step"] == 2
    assert [n for n, _ in skipped] == ["step_000003"] and why in skipped[0][1]
    assert _same(m, weights[2])


def test_two_damaged_checkpoints_fall_back_two_steps(run, tiny_model_dir):
    run_dir, weights = run
    _flip(_distcp(_step(run_dir, 3)))
    (_step(run_dir, 2) / "rng_rank0.pt").unlink()
    m, path, _, skipped = _load_into_fresh(tiny_model_dir, run_dir)
    assert path == _step(run_dir, 1) and len(skipped) == 2 and _same(m, weights[1])


def test_no_checkpoint_that_verifies_is_an_error_not_a_fresh_start(run, tiny_model_dir):
    run_dir, _ = run
    for n in (1, 2, 3):
        _truncate(_distcp(_step(run_dir, n)))
    m, opt = model_and_optimizer(tiny_model_dir)
    with pytest.raises(ckpt.CheckpointError, match="no checkpoint of .* verifies: step_000003: .*truncated"):
        ckpt.load_latest(run_dir, m, opt)
    with pytest.raises(ckpt.CheckpointError, match="cannot be used"):
        ckpt.load_checkpoint(_step(run_dir, 3), m, opt)


def test_resave_of_an_existing_step_killed_between_renames_keeps_the_old_copy(run, tiny_model_dir, monkeypatch):
    run_dir, weights = run
    m, opt = model_and_optimizer(tiny_model_dir)
    real = os.replace
    calls = []

    def crash_on_install(src, dst):
        calls.append((Path(src).name, Path(dst).name))
        if str(src).endswith(".tmp") and Path(dst).name == "step_000003":
            raise KeyboardInterrupt("killed between the renames")
        return real(src, dst)

    monkeypatch.setattr(ckpt.os, "replace", crash_on_install)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save_checkpoint(run_dir, 3, m, opt, {"model_path": tiny_model_dir}, keep=1)
    monkeypatch.setattr(ckpt.os, "replace", real)
    m2, path, state, skipped = _load_into_fresh(tiny_model_dir, run_dir)
    assert path == _step(run_dir, 3) and state["step"] == 3 and not skipped
    assert _same(m2, weights[3])
    assert not list((run_dir / "checkpoints").glob("*.replaced"))


def test_resave_replaces_the_step_and_keeps_only_k(run, tiny_model_dir):
    run_dir, _ = run
    m, opt = model_and_optimizer(tiny_model_dir)
    train_a_bit(m, opt, 99)
    ckpt.save_checkpoint(run_dir, 3, m, opt, {"model_path": tiny_model_dir}, keep=1)
    assert [p.name for p in ckpt.list_checkpoints(run_dir)] == ["step_000003"]
    m2, _, _, _ = _load_into_fresh(tiny_model_dir, run_dir)
    assert _same(m2, _params(m))


def test_best_checkpoint_is_kept_beside_the_last_k_and_exported(run, tiny_model_dir, tmp_path):
    run_dir, weights = run
    ckpt.mark_best(run_dir, 1, "val/em", 0.5)
    assert not ckpt.is_new_best(run_dir, 0.4) and ckpt.is_new_best(run_dir, 0.6)
    m, opt = model_and_optimizer(tiny_model_dir)
    for step in (4, 5, 6):
        train_a_bit(m, opt, step)
        ckpt.save_checkpoint(run_dir, step, m, opt, {"model_path": tiny_model_dir}, keep=2)
    assert [p.name for p in ckpt.list_checkpoints(run_dir)] == ["step_000001", "step_000005", "step_000006"]
    assert ckpt.select_checkpoint(run_dir, "best")[0] == _step(run_dir, 1)
    assert ckpt.select_checkpoint(run_dir, "5")[0] == _step(run_dir, 5)

    from mopd.cli import main

    assert main(["export", str(run_dir), "--checkpoint", "best", "--out", str(tmp_path / "hf")]) == 0
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    assert _same(exported, weights[1])


def test_export_refuses_a_damaged_or_unknown_choice(run, tmp_path, capsys):
    from mopd.cli import main

    run_dir, _ = run
    _flip(_distcp(_step(run_dir, 2)))
    assert main(["export", str(_step(run_dir, 2)), "--out", str(tmp_path / "a")]) == 2
    assert "sha256" in capsys.readouterr().err
    # A run that never validated exports its latest checkpoint, as `mopd train --export` does, and says so.
    assert main(["export", str(run_dir), "--checkpoint", "best", "--out", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "no best-validation checkpoint" in out and "exporting " + str(_step(run_dir, 3)) in out
    ckpt.mark_best(run_dir, 2, "val/em", 0.5)     # a damaged best is refused, not swapped for another one
    assert main(["export", str(run_dir), "--checkpoint", "best", "--out", str(tmp_path / "d")]) == 2
    assert "sha256" in capsys.readouterr().err
    assert main(["export", str(run_dir), "--checkpoint", "newest", "--out", str(tmp_path / "c")]) == 2
    assert not (tmp_path / "a").exists() and not (tmp_path / "c").exists() and not (tmp_path / "d").exists()


def test_checkpoint_written_before_manifests_still_loads(run, tiny_model_dir):
    run_dir, weights = run
    s3 = _step(run_dir, 3)
    (s3 / MANIFEST).unlink()
    state = json.loads((s3 / "trainer_state.json").read_text())
    del state["format"]
    (s3 / "trainer_state.json").write_text(json.dumps(state))
    m, path, _, skipped = _load_into_fresh(tiny_model_dir, run_dir)
    assert path == s3 and not skipped and _same(m, weights[3])


@pytest.mark.slow
def test_two_rank_checkpoint_manifest_lists_both_ranks_files(tiny_model_dir, qa_file, tmp_path):
    """Under torchrun each rank hashes its share of the files and rank 0 writes one manifest."""
    from tests.train.test_distributed import torchrun

    out = tmp_path / "run"
    torchrun(tiny_model_dir, qa_file, out)
    latest = ckpt.latest_checkpoint(out)
    files = json.loads((latest / MANIFEST).read_text())["files"]
    assert {"rng_rank0.pt", "rng_rank1.pt", ".metadata", "trainer_state.json"} <= set(files)
    assert len([n for n in files if n.endswith(".distcp")]) == 2 and verify_checkpoint(latest) is None


def test_verification_split_over_ranks_finds_corruption_in_exactly_one_share(run):
    run_dir, _ = run
    path = _step(run_dir, 3)
    names = sorted(json.loads((path / MANIFEST).read_text())["files"])
    victim = _distcp(path).name
    _flip(path / victim)
    owner = names.index(victim) % 3
    reasons = [verify_checkpoint(path, share=(r, 3)) for r in range(3)]
    assert [r is not None for r in reasons] == [r == owner for r in range(3)]
    assert "sha256" in reasons[owner]
