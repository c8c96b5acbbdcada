"""A checkpoint that cannot be used is skipped for an older one, said on the terminal, and never
a traceback: a malformed manifest (`[]`, plain-int entries), a checkpoint of another
model size copied into the run (resume and export), a base model of another size for export."""

import json
import shutil

import pytest
import torch

from mopd.cli import main
from mopd.train import checkpoint as ckpt
from mopd.train.manifest import MANIFEST, verify_checkpoint
from tests.reliability.runs import model_and_optimizer, step_dir, train_a_bit, weights_of


@pytest.fixture(scope="module")
def other_size_model(tmp_path_factory):
    from tests.helpers.tiny_model import init_tiny_model

    out = tmp_path_factory.mktemp("other_model")
    return str(init_tiny_model(out, vocab_size=400, hidden=64, layers=1, heads=2, ffn=96, seed=1))


def _last_line(err: str) -> str:
    """The last line on the terminal (transformers' progress bars redraw with carriage returns)."""
    return err.replace("\r", "\n").strip().splitlines()[-1]


def _damage_manifest(path, how):
    man = path / MANIFEST
    if how == "list":
        man.write_text("[]")
    elif how == "int entries":
        data = json.loads(man.read_text())
        data["files"] = {k: v["size"] for k, v in data["files"].items()}
        man.write_text(json.dumps(data))
    elif how == "files a list":
        man.write_text(json.dumps({"format": 2, "files": ["a", "b"]}))
    else:   # every entry well formed, one naming a file outside the checkpoint (never read)
        data = json.loads(man.read_text())
        data["files"]["../../../etc/hostname"] = {"size": 1, "sha256": "0" * 64}
        man.write_text(json.dumps(data))


MANIFESTS = ["list", "int entries", "files a list", "outside"]


@pytest.mark.parametrize("how", MANIFESTS)
def test_a_malformed_manifest_does_not_verify(run, how):
    _damage_manifest(step_dir(run[0], 3), how)
    reason = verify_checkpoint(step_dir(run[0], 3))
    assert reason is not None and ("malformed manifest.json" in reason or "unreadable manifest.json" in reason), \
        reason


def _copy_in_other_size_checkpoint(run_dir, other_size_model, tmp_path, step=4):
    m, opt = model_and_optimizer(other_size_model)
    train_a_bit(m, opt, 9)
    ckpt.save_checkpoint(tmp_path / "other", 1, m, opt, {"model_path": other_size_model})
    shutil.copytree(step_dir(tmp_path / "other", 1), step_dir(run_dir, step))


@pytest.mark.parametrize("damage", ["manifest list", "manifest int entries", "another model size"])
def test_resume_falls_back_and_says_so_on_the_terminal(run, tiny_model_dir, other_size_model, tmp_path, capsys,
                                                       damage):
    from tests.helpers.retrievers import FakeRetriever
    from mopd.train.trainer import PolicyTrainer

    run_dir, cfg = run
    newest = 3
    if damage == "another model size":
        _copy_in_other_size_checkpoint(run_dir, other_size_model, tmp_path)
        newest = 4
    else:
        _damage_manifest(step_dir(run_dir, 3), damage.removeprefix("manifest "))
    expected = 2 if newest == 3 else 3
    want = weights_of(tiny_model_dir, step_dir(run_dir, expected))
    capsys.readouterr()
    t = PolicyTrainer(cfg, retriever=FakeRetriever(), resume=True, progress=False)
    try:
        assert t.step == expected
        got = t.model.state_dict()
        assert all(torch.equal(got[k], want[k]) for k in want)
    finally:
        t.close()
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("mopd: ")]
    assert any(f"checkpoint step_{newest:06d} skipped: " in x for x in lines), lines
    assert any(f"resuming from step_{expected:06d}" in x for x in lines), lines
    if damage == "another model size":
        assert any("another model size" in x for x in lines), lines


def test_export_skips_a_checkpoint_of_another_model_size(run, other_size_model, tmp_path, capsys):
    run_dir, _ = run
    _copy_in_other_size_checkpoint(run_dir, other_size_model, tmp_path)
    capsys.readouterr()
    assert main(["export", str(run_dir), "--checkpoint", "latest", "--out", str(tmp_path / "hf")]) == 0
    out = capsys.readouterr().out
    assert "skipped step_000004" in out and "another model size" in out and "using step_000003" in out
    conf = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert conf["hidden_size"] == 32
    assert main(["export", str(run_dir), "--checkpoint", "4", "--out", str(tmp_path / "hf4")]) == 2
    err = _last_line(capsys.readouterr().err)
    assert "Traceback" not in err and "another model size" in err and not (tmp_path / "hf4").exists(), err


def test_export_with_a_base_model_of_another_size_is_one_line(run, other_size_model, tmp_path, capsys):
    capsys.readouterr()
    rc = main(["export", str(run[0]), "--base-model", other_size_model, "--out", str(tmp_path / "hf")])
    full = capsys.readouterr().err
    err = _last_line(full)
    assert rc == 2 and err.startswith("mopd export: error: ") and "Traceback" not in full, err
    assert "another model size" in err and not (tmp_path / "hf").exists()


def test_a_checkpoint_from_another_base_model_does_not_verify_for_this_run(run, tiny_model_dir):
    run_dir, _ = run
    ours = json.loads((run_dir / "run.json").read_text())["model"]["weights"]
    state = step_dir(run_dir, 3) / "trainer_state.json"
    data = json.loads(state.read_text())
    assert data["base_model_weights"] == ours          # every checkpoint records its run's base model
    data["base_model_weights"] = "b" * 32              # as if copied in from a run of other weights,
    state.write_text(json.dumps(data))
    from mopd.train.manifest import write_manifest

    write_manifest(step_dir(run_dir, 3))               # with a manifest that verifies
    m, _ = model_and_optimizer(tiny_model_dir)
    found, skipped = ckpt.find_checkpoint(run_dir, m)
    assert found == step_dir(run_dir, 2)
    assert skipped[0][0] == step_dir(run_dir, 3) and "another base model" in skipped[0][1]
    run_json = json.loads((run_dir / "run.json").read_text())    # an accepted --allow-changed of the model
    run_json["changes"] = [{"time": 0, "changed": {"model.weights": ["b" * 32, ours]}}]
    (run_dir / "run.json").write_text(json.dumps(run_json))
    assert ckpt.find_checkpoint(run_dir, m)[0] == step_dir(run_dir, 3)
