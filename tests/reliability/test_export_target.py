"""`mopd export` and `mopd train --export` never delete what the user did not ask to delete:
they write a new or empty directory, or replace an earlier export of the same run
(its marker file), and refuse anything else with one line, with the user's files untouched."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from mopd.cli import main
from mopd.train.export_target import EXPORT_MARKER
from tests.reliability.runs import step_dir, write_run


@pytest.fixture(scope="module")
def run(tiny_model_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("exp") / "run"
    return d, write_run(d, tiny_model_dir)


def _export(capsys, *argv):
    capsys.readouterr()    # what came before (progress bars of the set-up)
    rc = main(["export", *map(str, argv)])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err.strip()


def _refused(capsys, *argv, needle):
    rc, _, err = _export(capsys, *argv)
    assert rc == 2 and err.startswith("mopd export: error: ") and "\n" not in err and "Traceback" not in err, err
    assert needle in err, err


def _tree(d):
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


def _weights(d):
    (f,) = sorted(d.glob("*.safetensors"))
    return load_file(str(f))


def test_a_folder_with_the_users_files_is_refused_and_kept(run, tmp_path, capsys):
    out = tmp_path / "mine"
    (out / "sub").mkdir(parents=True)
    (out / "notes.txt").write_text("my notes\n")
    (out / "sub" / "results.csv").write_text("a,b\n1,2\n")
    _refused(capsys, run[0], "--out", out, needle="is not empty and is not an earlier export of this run")
    assert _tree(out) == ["notes.txt", "sub", "sub/results.csv"]
    assert (out / "notes.txt").read_text() == "my notes\n"


def test_the_run_itself_is_never_the_target(run, tmp_path, capsys):
    before = _tree(run[0])
    _refused(capsys, run[0], "--out", run[0], needle="is the run directory itself")
    _refused(capsys, run[0], "--out", run[0] / "checkpoints", needle="inside the run's own files")
    other = tmp_path / "other_run"
    write_run(other, json.loads((step_dir(run[0], 1) / "trainer_state.json").read_text())["model_path"], steps=(1,))
    _refused(capsys, run[0], "--out", other, needle="is a training run directory")
    assert _tree(run[0]) == before


def test_an_existing_file_is_refused_and_nothing_is_left_beside_it(run, tmp_path, capsys):
    f = tmp_path / "model.bin"
    f.write_text("not a directory")
    _refused(capsys, run[0], "--out", f, needle="is a file")
    _refused(capsys, run[0], "--out", f / "sub", needle="which is a file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.bin"]


def test_new_empty_and_earlier_export_of_the_same_run_are_written(run, tmp_path, capsys):
    run_dir, weights = run
    new = tmp_path / "a" / "b"
    assert _export(capsys, run_dir, "--out", new, "--checkpoint", "1")[0] == 0
    mark = json.loads((new / EXPORT_MARKER).read_text())
    assert mark["run"] == str(run_dir.resolve()) and mark["step"] == 1
    assert torch.equal(_weights(new)["model.norm.weight"], weights[1]["model.norm.weight"])
    assert _export(capsys, run_dir, "--out", new, "--checkpoint", "2")[0] == 0    # replaces its own export
    assert json.loads((new / EXPORT_MARKER).read_text())["step"] == 2
    assert any(not torch.equal(_weights(new)[k], weights[1][k]) for k in weights[1] if k in _weights(new))
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _export(capsys, run_dir, "--out", empty)[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "empty"]    # no temporary directories left


def test_an_export_of_another_run_is_not_replaced(run, tiny_model_dir, tmp_path, capsys):
    other = tmp_path / "other"
    write_run(other, tiny_model_dir, steps=(1,))
    out = tmp_path / "exp"
    assert _export(capsys, other, "--out", out)[0] == 0
    before = (out / EXPORT_MARKER).read_text()
    _refused(capsys, run[0], "--out", out, needle="holds an export of another run")
    assert (out / EXPORT_MARKER).read_text() == before


def test_train_export_into_the_run_directory_is_refused_before_training(tiny_model_dir, qa_file, tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["train", "--export", str(out), "tiny_cmas_rl", f"model.path={tiny_model_dir}",
               f"data.train={qa_file}", f"trainer.out_dir={out}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "--export" in err and "is the run directory itself" in err, err
    assert not out.exists()
    user = tmp_path / "user"
    user.mkdir()
    (user / "keep.txt").write_text("x")
    rc = main(["train", "--export", str(user), "tiny_cmas_rl", f"model.path={tiny_model_dir}",
               f"data.train={qa_file}", f"trainer.out_dir={tmp_path / 'run2'}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "is not empty" in err and (user / "keep.txt").read_text() == "x", err
    assert not (tmp_path / "run2").exists()


def test_export_and_train_export_choose_the_best_checkpoint_by_default(run, tmp_path, capsys):
    run_dir, weights = run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    from mopd.train import checkpoint as ckpt

    ckpt.mark_best(copy, 2, "val/em", 0.7)
    rc, out, _ = _export(capsys, copy, "--out", tmp_path / "hf")
    assert rc == 0 and "step_000002" in out
    got = _weights(tmp_path / "hf")
    assert all(torch.equal(got[k], weights[2][k]) for k in got)
    rc, out, _ = _export(capsys, run_dir, "--out", tmp_path / "hf2")    # never validated: the latest
    assert rc == 0 and "no best-validation checkpoint" in out and "step_000003" in out
    from mopd.train.commands import register
    import argparse

    sub = argparse.ArgumentParser().add_subparsers()
    register(sub)
    train = sub.choices["train"].parse_args(["tiny_cmas_rl"])
    export = sub.choices["export"].parse_args(["RUN", "--out", "X"])
    assert train.export_checkpoint == export.which == "best"
