"""Exports recover: a re-export killed at any point leaves the earlier or the new
export at the target, or (where the filesystem cannot exchange two directories, between the two
renames) the earlier one in a hidden folder that the next export or `mopd export --repair` puts
back; nothing hidden is left to accumulate. And a malformed checkpoints/best.json (item 5) is
treated as no best, said in one line, never a traceback.

A kill is simulated in-process: from the chosen step of putting the export in place (an exchange,
a rename, a removal) on, every such step on the target or its hidden siblings raises, so no
cleanup runs, as if the process had been killed there."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from mopd.cli import main
from mopd.train import checkpoint as ckpt
from mopd.train import export_target
from mopd.train.export_target import EXPORT_MARKER
from tests.reliability.runs import model_and_optimizer, write_run


class Killed(BaseException):
    """The process died here (nothing after it runs, not even an ``except BaseException``)."""


@pytest.fixture(scope="module")
def run(tiny_model_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("exp") / "run"
    write_run(d, tiny_model_dir)
    return d


@pytest.fixture(scope="module")
def first(run, tmp_path_factory):
    """An export of step 1 (copied into each test's target)."""
    out = tmp_path_factory.mktemp("first") / "model"
    assert main(["export", str(run), "--checkpoint", "1", "--out", str(out)]) == 0
    return out


def _export(capsys, *argv):
    capsys.readouterr()
    rc = main(["export", *map(str, argv)])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _step_at(out: Path):
    return json.loads((out / EXPORT_MARKER).read_text())["step"] if (out / EXPORT_MARKER).is_file() else None


def _hidden(out: Path):
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


def kill_at(monkeypatch, out: Path, n: int, exchange: bool):
    """The ``n``-th step of putting an export at ``out`` (0: the first) and every one after it die."""
    state = {"steps": 0, "dead": False}

    def ours(p) -> bool:
        p = Path(p)
        hidden = f".{out.name}.export-"
        return p == out or p.name.startswith(hidden) or (p.name == "old" and p.parent.name.startswith(hidden))

    def guarded(real):
        def step(*a, **k):
            if any(ours(p) for p in a[:2] if isinstance(p, (str, os.PathLike))):
                if state["dead"] or state["steps"] == n:
                    state["dead"] = True
                    raise Killed
                state["steps"] += 1
            return real(*a, **k)
        return step

    monkeypatch.setattr(os, "replace", guarded(os.replace))
    monkeypatch.setattr(shutil, "rmtree", guarded(shutil.rmtree))
    monkeypatch.setattr(export_target, "_exchange", guarded(export_target._exchange) if exchange else
                        (lambda a, b: False))
    return state


# (exchange available, step killed) -> the export the target holds after the repair: with an
# exchange, 0 = before it (the earlier), 1 = before the old copy is removed (the new); with two
# renames, 0 = before the first, 1 = between them (the earlier), 2 = before the aside is removed (the new)
KILLS = {(True, 0): 1, (True, 1): 2, (False, 0): 1, (False, 1): 1, (False, 2): 2}


def _killed_reexport(run, first, tmp_path, monkeypatch, exchange, n):
    out = tmp_path / "model"
    shutil.copytree(first, out)
    state = kill_at(monkeypatch, out, n, exchange)
    with pytest.raises(Killed):
        main(["export", str(run), "--checkpoint", "2", "--out", str(out)])
    monkeypatch.undo()
    assert state["dead"]
    return out


@pytest.mark.parametrize("exchange,n", KILLS, ids=[f"{'exchange' if e else 'renames'}-{n}" for e, n in KILLS])
def test_a_killed_reexport_leaves_an_export_that_repair_restores(exchange, n, run, first, tmp_path, monkeypatch,
                                                                  capsys):
    out = _killed_reexport(run, first, tmp_path, monkeypatch, exchange, n)
    if exchange or n != 1:
        assert _step_at(out) == KILLS[exchange, n]   # the earlier export or the new one, complete
    else:
        assert not out.exists()                 # between the two renames: the earlier one is aside
        assert any(name.startswith(".model.export-old-") for name in _hidden(out))
    assert _hidden(out)                         # something was left beside it
    rc, said, err = _export(capsys, run, "--out", out, "--repair")
    assert rc == 0 and not err.strip(), err
    assert said.strip() and all(line.startswith(("restored", "removed")) for line in said.splitlines()), said
    assert _step_at(out) == KILLS[exchange, n] and not _hidden(out)
    rc, said, _ = _export(capsys, run, "--out", out, "--repair")
    assert rc == 0 and said.strip() == f"nothing to repair: no interrupted export beside {out}"


def test_the_next_export_repairs_first_and_nothing_hidden_accumulates(run, first, tmp_path, monkeypatch, capsys):
    """Two exports killed between the renames (the old code leaked a model copy each time), then
    one that completes: one export at the target, of the step asked, and nothing hidden."""
    out = _killed_reexport(run, first, tmp_path, monkeypatch, exchange=False, n=1)
    # steps of the next export: its repair (0 the restore, 1 and 2 the removals), then 3 and 4 the renames
    state = kill_at(monkeypatch, out, 4, exchange=False)
    with pytest.raises(Killed):
        main(["export", str(run), "--checkpoint", "2", "--out", str(out)])
    monkeypatch.undo()
    assert state["dead"] and not out.exists()
    assert len([name for name in _hidden(out) if name.startswith(".model.export-old-")]) == 1
    rc, said, _ = _export(capsys, run, "--out", out, "--checkpoint", "3")
    assert rc == 0 and f"restored {out}" in said and said.rstrip().endswith(f"exported {out}"), said
    assert _step_at(out) == 3 and not _hidden(out)


def test_an_exception_between_the_renames_puts_the_earlier_export_back(run, first, tmp_path, monkeypatch, capsys):
    """Ctrl-C (or a full disk) as the new export is renamed in: the old one is back at once."""
    out = tmp_path / "model"
    shutil.copytree(first, out)
    real = os.replace

    def refused(src, dst):
        if Path(dst) == out and Path(src).name.startswith(".model.export-"):
            raise KeyboardInterrupt
        return real(src, dst)

    monkeypatch.setattr(export_target, "_exchange", lambda a, b: False)
    monkeypatch.setattr(os, "replace", refused)
    rc, _, err = _export(capsys, run, "--out", out, "--checkpoint", "2")
    monkeypatch.undo()
    assert rc == 130 and "Traceback" not in err
    assert _step_at(out) == 1 and not _hidden(out)


def test_repair_leaves_what_is_not_an_export(run, tmp_path, capsys):
    out = tmp_path / "model"
    notes = tmp_path / ".model.export-mine"
    notes.mkdir()
    (notes / "notes.txt").write_text("mine\n")
    rc, said, _ = _export(capsys, run, "--out", out, "--repair")
    assert rc == 0 and said.strip() == f"left {notes}: it holds files that are not an export's"
    assert (notes / "notes.txt").read_text() == "mine\n"


# ---------------------------------------------------------------- a malformed best.json (item 5)
MALFORMED = ["{", "[]", '{"step": "two", "value": 0.5}', '{"step": 2}', '{"step": 2, "value": NaN}',
             '{"step": true, "value": 0.5}', "\xff\xfe"]


@pytest.mark.parametrize("text", MALFORMED)
def test_a_malformed_best_json_counts_as_no_best(text, run, tiny_model_dir, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    best = copy / "checkpoints" / "best.json"
    best.write_bytes(text.encode("latin-1"))
    problem = ckpt.best_problem(copy)
    assert problem.startswith(f"{best} is malformed (") and "\n" not in problem
    assert ckpt.read_best(copy) is None and ckpt.best_checkpoint(copy) is None and ckpt.is_new_best(copy, 0.0)
    m, opt = model_and_optimizer(tiny_model_dir)       # retention reads best.json too
    ckpt.save_checkpoint(copy, 4, m, opt, {"model_path": tiny_model_dir}, keep=1)
    assert [p.name for p in ckpt.list_checkpoints(copy)] == ["step_000004"]


def test_export_with_a_malformed_best_json_says_so_and_exports_the_latest(run, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    (copy / "checkpoints" / "best.json").write_text('{"step": "two"}')
    rc, said, err = _export(capsys, copy, "--out", tmp_path / "hf")
    assert rc == 0 and "Traceback" not in err, err
    assert "best.json is malformed (no step number" in said and \
        "treated as no best-validation checkpoint; exporting the latest" in said, said
    assert _step_at(tmp_path / "hf") == 3
