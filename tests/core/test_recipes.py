"""Recipes load once, the same way for every caller, and a broken one never takes the core down
(mopd.core.recipes; every registry reads through it)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
import uuid

import pytest

from mopd.config import ConfigError, PRESETS
from mopd.core import recipes
from mopd.pipeline.presets import PIPELINES

# Run mopd's command line in a fresh interpreter with one more recipe folder (argv[1]: a folder or
# ''), added to the recipes package's folders, where the loader looks.
_CLI = ("import importlib, sys\n"
        "from mopd.core.recipes import PACKAGE\n"
        "if sys.argv[1]: importlib.import_module(PACKAGE).__path__.append(sys.argv[1])\n"
        "from mopd.cli import main\n"
        "sys.exit(main(sys.argv[2:]))\n")


def _fresh(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)


def _recipe(root, name: str, body: str):
    pkg = root / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(body))
    return pkg


@pytest.fixture
def fresh_loader(monkeypatch, tmp_path):
    """The loader as in a new process, with ``tmp_path`` as one more recipe folder (the recipes that
    already loaded stay imported, so loading them again registers nothing new)."""
    monkeypatch.setattr(recipes, "_state", {"done": False, "loading": False})
    monkeypatch.setattr(recipes, "_loaded", [])
    monkeypatch.setattr(recipes, "_failed", {})
    package = importlib.import_module(recipes.PACKAGE)   # the folders the loader searches
    monkeypatch.setattr(package, "__path__", list(package.__path__) + [str(tmp_path)])
    yield tmp_path
    for mod in [m for m in sys.modules if m.startswith("mopd.recipes.r_")]:
        del sys.modules[mod]


def test_python_and_the_command_line_list_the_same_presets_and_pipelines():
    listed = _fresh("from mopd.config import preset_names\nfrom mopd.pipeline.presets import PIPELINES\n"
                    "print(' '.join(preset_names())); print(' '.join(PIPELINES))")
    assert listed.returncode == 0, listed.stderr
    presets, pipelines = (line.split() for line in listed.stdout.splitlines())
    cli = _fresh(_CLI, "", "config", "list")
    assert cli.returncode == 0, cli.stderr
    shown = [line.split()[0] for line in cli.stdout.splitlines() if line and not line.startswith(" ")]
    assert shown == presets
    assert any(p.startswith("tiny_") for p in presets) and "demo_quick" in pipelines   # the bundled recipe's
    listed_pipelines = _fresh(_CLI, "", "pipeline", "--list").stdout.splitlines()
    assert [line.split()[0] for line in listed_pipelines if line and not line.startswith(" ")] == pipelines


def test_a_broken_recipe_costs_one_warning_and_no_command(tmp_path):
    name = f"r_broken_{uuid.uuid4().hex[:6]}"
    _recipe(tmp_path, name, "from mopd.config import register_preset\n\n"
                            "@register_preset\ndef only_broken():\n    return None\n\n"
                            "import mopd_frobnicate  # not installed\n")
    shown = _fresh(_CLI, str(tmp_path), "config", "show", "cmas_rl")   # the core's preset: no recipe imported
    assert shown.returncode == 0 and shown.stderr == "", shown.stderr
    assert "algo:" in shown.stdout
    listed = _fresh(_CLI, str(tmp_path), "config", "list")   # every preset: the recipes are imported
    assert listed.returncode == 0 and "cmas_rl" in listed.stdout and "tiny_cmas_rl" in listed.stdout
    warning = listed.stderr.strip()
    assert "\n" not in warning and f"mopd.recipes.{name}" in warning and "mopd_frobnicate" in warning
    helped = _fresh(_CLI, str(tmp_path), "--help")   # imports no recipe: lists their commands from source
    assert helped.returncode == 0 and "config" in helped.stdout and "demo" in helped.stdout
    assert helped.stderr == ""
    # a name only it would have provided: one line that says so (its preset was taken out again)
    named = _fresh(_CLI, str(tmp_path), "config", "show", "only_broken")
    lines = named.stderr.strip().splitlines()
    assert named.returncode == 2 and len(lines) == 2 and lines[0] == warning, named.stderr
    assert "unknown preset 'only_broken'" in lines[1] and f"recipe mopd.recipes.{name} failed to load" in lines[1]


def test_a_failing_recipe_is_taken_out_whole(fresh_loader, capsys):
    _recipe(fresh_loader, "r_half", """\
        from mopd.config import register_preset
        from mopd.pipeline.presets import pipeline_preset

        @pipeline_preset
        def r_half_pipeline():
            return None

        raise RuntimeError("half-way\\n  across two lines")
        """)
    assert "mopd.recipes.r_half" not in recipes.load_recipes()
    err = capsys.readouterr().err
    assert err == ("mopd: warning: recipe mopd.recipes.r_half failed to load and is skipped: "
                   "RuntimeError: half-way across two lines\n")
    assert "r_half_pipeline" not in PIPELINES and "mopd.recipes.r_half" not in sys.modules
    with pytest.raises(ConfigError, match="unknown pipeline 'r_half_pipeline'.*recipe mopd.recipes.r_half failed"):
        PIPELINES.lookup("r_half_pipeline")
    assert "demo_quick" in PIPELINES   # the bundled recipe still loads


def test_two_recipes_registering_one_name_are_refused_naming_both(fresh_loader, capsys):
    body = """\
        from mopd.config import register_preset

        @register_preset
        def r_shared_name():
            return None
        """
    _recipe(fresh_loader, "r_first", body)
    _recipe(fresh_loader, "r_second", body)
    try:
        loaded = recipes.load_recipes()
        assert "mopd.recipes.r_first" in loaded and "mopd.recipes.r_second" not in loaded
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert "recipe mopd.recipes.r_second failed to load" in line
        assert "mopd.recipes.r_first.r_shared_name" in line and "mopd.recipes.r_second.r_shared_name" in line
        assert PRESETS["r_shared_name"].__module__ == "mopd.recipes.r_first"
    finally:
        PRESETS.unregister("r_shared_name")


def test_every_read_of_a_registry_loads_the_recipes(fresh_loader):
    _recipe(fresh_loader, "r_reward", """\
        from mopd.config.registries import register_reward

        @register_reward("r_reward_bonus")
        class Bonus:
            pass
        """)
    from mopd.config.method import RewardConfig
    from mopd.config.registries import REWARDS

    try:
        # a config check is the first read: choice() finds the recipe's reward with no lookup before it
        assert RewardConfig(roles={"answerer": "r_reward_bonus"}).of("answerer") == "r_reward_bonus"
        assert recipes.load_recipes()[-1] == "mopd.recipes.r_reward"
    finally:
        REWARDS.unregister("r_reward_bonus")
