"""`mopd pipeline`'s command line: its switches before or after PRESET, a pipeline from a file
alone, the presets listed, and the pinned CPU environment of an in-process run."""

import os
import subprocess
import sys
from pathlib import Path

from mopd.cli import main
from mopd.core.reproducible import CPU_ENV

ROOT = Path(__file__).resolve().parents[2]


def test_switches_go_before_or_after_the_preset(capsys, tmp_path):
    assert main(["pipeline", "--show", "paper", "stage1.steps=3"]) == 0
    before = capsys.readouterr().out
    assert main(["pipeline", "paper", "stage1.steps=3", "--show"]) == 0
    assert capsys.readouterr().out == before and "steps: 3" in before
    f = tmp_path / "p.yaml"
    f.write_text(before)
    assert main(["pipeline", "--file", str(f), "--dry-run", f"root={tmp_path}/r"]) == 0   # a file alone
    assert f"pipeline paper: 15 stages under {tmp_path}/r" in capsys.readouterr().out


def test_presets_are_listed_and_a_missing_one_is_named(capsys):
    assert main(["pipeline", "--list"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("paper ") and "\ndemo " in out and "\ndemo_quick " in out
    assert main(["pipeline"]) == 2
    assert "name a pipeline preset (paper, demo, demo_quick" in capsys.readouterr().err
    assert main(["pipeline", "paper", "stage1.preset=nope"]) == 2


def test_an_in_process_run_pins_the_cpu_environment_before_torch_loads():
    code = ("import os, sys\n"
            "import mopd.pipeline.run as run\n"
            "run.run_pipeline = lambda cfg: print('torch' in sys.modules, os.environ.get('MKL_CBWR')) or 'r'\n"
            "from mopd.cli import main\n"
            "main(['pipeline', 'paper'])\n"
            "main(['pipeline', 'demo_quick'])\n")
    env = {k: v for k, v in os.environ.items() if k not in CPU_ENV}
    out = subprocess.run([sys.executable, "-c", code], env=env | {"PYTHONPATH": str(ROOT)}, capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "None", "report:", "r", "False", CPU_ENV["MKL_CBWR"], "report:", "r"]
