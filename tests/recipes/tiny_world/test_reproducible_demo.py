"""A tiny run of the demo's stages gives the same weights and metrics, bit for bit, in two fresh
processes (with different hash seeds); the recipe's commands pin the CPU environment."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mopd.core.reproducible import CPU_ENV, pin_cpu_environment

WORKER = Path(__file__).with_name("determinism_worker.py")
ROOT = Path(__file__).resolve().parents[3]


def _run(tmp: Path, hash_seed: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in CPU_ENV}
    pin_cpu_environment(env)
    env.update(PYTHONHASHSEED=hash_seed, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    out = subprocess.run([sys.executable, str(WORKER), str(tmp)], env=env, capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_same_seed_same_bits_in_fresh_processes(tmp_path):
    a = _run(tmp_path / "a", "1")
    b = _run(tmp_path / "b", "2")
    assert a["env"] == b["env"] == {k: os.environ.get(k, v) for k, v in CPU_ENV.items()}
    assert a["torch_threads"] == 1
    assert a["pi0_losses"] == b["pi0_losses"] and len(a["pi0_losses"]) == 3
    assert a["pi0"] == b["pi0"]
    assert a["stage1_metrics"] == b["stage1_metrics"] and len(a["stage1_metrics"]) >= 1
    assert a["stage1"] == b["stage1"]
    assert a["stage1"] != a["pi0"]


def test_the_world_and_demo_commands_pin_the_environment():
    """`mopd world ...` and `mopd demo` pin the variables in the handler's process (torch not yet loaded
    when they are set); another command leaves the environment alone."""
    code = ("import os, sys\n"
            "import mopd.cli, mopd.commands as mc, mopd.recipes.tiny_world.commands as dc\n"
            "def handler(args):\n"
            "    print('torch' in sys.modules, os.environ.get('MKL_CBWR'))\n"
            "dc._build = mc._list = handler\n"   # registered by build_parser, which main() calls
            "mopd.cli.main(['config', 'list'])\n"
            "mopd.cli.main(['world', 'build', '--out', 'x'])\n")
    env = {k: v for k, v in os.environ.items() if k not in CPU_ENV}
    out = subprocess.run([sys.executable, "-c", code], env=env | {"PYTHONPATH": str(ROOT)}, capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "None", "False", CPU_ENV["MKL_CBWR"]]
