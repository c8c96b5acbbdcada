"""`mopd demo --quick` wrote into runs/demo, the full demo's directory, where a later `mopd demo`
(or the quick run after it) rebuilt the other's world and pi_0. Each mode has its own default
directory, and a directory that another mode built is refused in one line, never rebuilt.

(Here, not in tests/reliability/: a test that imports a recipe lives in its folder, tests/test_layering.py.)"""

import itertools
import json

import pytest

import mopd.recipes.tiny_world.demo as demo
from mopd.cli import main

MODES = {"": "runs/demo", "--quick": "runs/demo_quick", "--lora": "runs/demo_lora",
         "--lora --quick": "runs/demo_lora_quick", "--seeds 1": "runs/demo_seeds",
         "--quick --seeds 1": "runs/demo_quick_seeds", "--lora --seeds 1": "runs/demo_lora_seeds",
         "--lora --quick --seeds 1": "runs/demo_lora_quick_seeds"}


@pytest.fixture
def started(monkeypatch):
    """What `mopd demo` would run (the settings of each demo, and of each seeds run), recorded
    instead of run."""
    seen = []
    monkeypatch.setattr(demo, "run_pipeline", lambda cfg: seen.append(cfg.root) or "report.md")
    monkeypatch.setattr(demo, "run_seeds", lambda s, seeds: seen.append(s.out) or "summary.md")
    return seen


@pytest.mark.parametrize("flags", list(MODES))
def test_each_mode_has_its_own_default_directory(flags, started, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["demo", *flags.split()]) == 0
    assert started == [MODES[flags]]
    assert len(set(MODES.values())) == len(MODES)


@pytest.mark.parametrize("built, now", list(itertools.permutations(["", "--quick", "--lora", "--lora --quick"], 2)))
def test_a_directory_another_mode_built_is_refused_and_kept(built, now, started, tmp_path, capsys):
    root = tmp_path / "mine"
    assert main(["demo", *built.split(), "--out", str(root)]) == 0   # records its settings, then (here) nothing
    pi0 = root / "pi0"
    pi0.mkdir()
    (pi0 / "pi0.json").write_text(json.dumps({"settings": {"steps": 123}}))   # 12-25 minutes of work, say
    before = (root / "demo_settings.json").read_text()
    capsys.readouterr()
    assert main(["demo", *now.split(), "--out", str(root)]) == 2
    err = capsys.readouterr().err.strip()
    theirs = {"": "full", "--quick": "quick", "--lora": "LoRA", "--lora --quick": "LoRA quick"}
    assert err == (f"mopd demo: error: {root} holds a {theirs[built]} demo; a {theirs[now]} run would rebuild its "
                   f"world and pi_0: give it its own directory (--out; by default each mode has one), or remove "
                   f"{root} first")
    assert started == [str(root)]   # the refused run started nothing
    assert (root / "demo_settings.json").read_text() == before and (pi0 / "pi0.json").is_file()
    assert main(["demo", *built.split(), "--out", str(root)]) == 0   # its own mode goes on as before
