"""Nothing read from a run directory or checkpoint runs code: a crafted pickle in
``rng_rank0.pt`` or DCP's ``.metadata``, with a manifest that verifies (anyone can recompute it),
never creates its marker file on ``--resume`` or ``mopd export``; the checkpoint is skipped for an
older one, said in one line. RNG states still round-trip exactly, old RNG files included."""

import pickle
import random

import numpy as np
import pytest
import torch

from mopd.cli import main
from mopd.train import checkpoint as ckpt
from mopd.train.manifest import write_manifest
from mopd.train.safe_load import UnsafeCheckpointFile, load_rng_file, read_dcp_metadata
from tests.reliability.runs import step_dir, weights_of


class _MakesMarker:
    """Unpickling this creates ``path`` (what a hostile checkpoint would do instead)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return exec, (f"open({self.path!r}, 'w').close()",)


def _plant(step, name, marker):
    """Replace ``name`` in ``step`` by a crafted pickle and re-write the manifest so it verifies."""
    if name.endswith(".pt"):
        torch.save({"torch": _MakesMarker(marker), "numpy": 0, "python": 0}, step / name)
    else:
        (step / name).write_bytes(pickle.dumps(_MakesMarker(marker), protocol=4))
    write_manifest(step)


@pytest.mark.parametrize("name", ["rng_rank0.pt", ".metadata"])
def test_resume_never_runs_a_crafted_pickle(run, tiny_model_dir, tmp_path, capsys, name):
    from mopd.train.trainer import PolicyTrainer
    from tests.helpers.retrievers import FakeRetriever

    run_dir, cfg = run
    marker = tmp_path / "marker"
    _plant(step_dir(run_dir, 3), name, marker)
    want = weights_of(tiny_model_dir, step_dir(run_dir, 2))
    capsys.readouterr()
    t = PolicyTrainer(cfg, retriever=FakeRetriever(), resume=True, progress=False)
    try:
        assert not marker.exists()
        assert t.step == 2
        got = t.model.state_dict()
        assert all(torch.equal(got[k], want[k]) for k in want)
    finally:
        t.close()
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("mopd: ")]
    skipped = [x for x in lines if "checkpoint step_000003 skipped: " in x]
    assert skipped and name in skipped[0] and "refused" in skipped[0], lines


@pytest.mark.parametrize("name", ["rng_rank0.pt", ".metadata"])
def test_export_never_runs_a_crafted_pickle(run, tmp_path, capsys, name):
    marker = tmp_path / "marker"
    _plant(step_dir(run[0], 3), name, marker)
    capsys.readouterr()
    assert main(["export", str(run[0]), "--checkpoint", "latest", "--out", str(tmp_path / "hf")]) == 0
    assert not marker.exists()
    assert "skipped step_000003" in capsys.readouterr().out
    rc = main(["export", str(step_dir(run[0], 3)), "--out", str(tmp_path / "hf3")])
    err = capsys.readouterr().err
    assert rc == 2 and not marker.exists() and "Traceback" not in err and "refused" in err, err


def test_a_crafted_metadata_is_refused_before_anything_is_built(tmp_path):
    step = tmp_path / "step"
    step.mkdir()
    (step / ".metadata").write_bytes(pickle.dumps(_MakesMarker(tmp_path / "marker"), protocol=4))
    with pytest.raises(UnsafeCheckpointFile, match="builtins.exec"):
        read_dcp_metadata(step)
    assert not (tmp_path / "marker").exists()


def _draws():
    return torch.rand(3).tolist(), np.random.rand(3).tolist(), [random.random() for _ in range(3)]


def test_rng_state_round_trips_through_weights_only_loading(tmp_path):
    torch.manual_seed(5), np.random.seed(6), random.seed(7)
    np.random.randn()                                    # numpy's cached gaussian is part of the state
    torch.save(ckpt.rng_state(), tmp_path / "rng.pt")
    expected = _draws()
    ckpt.set_rng_state(load_rng_file(tmp_path / "rng.pt"))
    assert _draws() == expected


def test_an_rng_file_of_the_earlier_format_still_loads(tmp_path):
    """Earlier checkpoints pickled numpy's state tuple (an array inside): read with numpy's array
    classes allowed, nothing else."""
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    torch.save({"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
                "cuda": None}, tmp_path / "old.pt")
    expected = _draws()
    ckpt.set_rng_state(load_rng_file(tmp_path / "old.pt"))
    assert _draws() == expected


def test_a_crafted_non_tensor_entry_never_runs(run, tiny_model_dir, tmp_path):
    """DCP stores non-tensor entries (the optimizer's hyperparameters) as torch.save bytes inside a
    shard; one pointed at a crafted pickle (the metadata rewritten to match, with its allowed
    classes only) is refused unrun."""
    from mopd.train.safe_load import read_dcp_metadata
    from tests.reliability.runs import model_and_optimizer

    step = step_dir(run[0], 3)
    meta = read_dcp_metadata(step)
    key = next(k for k in meta.storage_data if k.fqn.startswith("optim.param_groups.") and k.fqn.endswith(".lr"))
    info = meta.storage_data[key]
    shard = step / info.relative_path
    crafted = tmp_path / "crafted.pt"
    torch.save(_MakesMarker(tmp_path / "marker"), crafted)
    info.offset, info.length = shard.stat().st_size, crafted.stat().st_size
    with open(shard, "ab") as f:
        f.write(crafted.read_bytes())
    (step / ".metadata").write_bytes(pickle.dumps(meta, protocol=4))
    write_manifest(step)
    m, opt = model_and_optimizer(tiny_model_dir)
    with pytest.raises(ckpt.CheckpointError, match="not plain data.*refused"):
        ckpt.load_checkpoint(step, m, opt)
    assert not (tmp_path / "marker").exists()
