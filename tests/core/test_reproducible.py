"""Bit-reproducible CPU runs: the pinned environment and deterministic torch (the tiny world's
seeded run in two fresh processes is in tests/recipes/tiny_world/test_reproducible_demo.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mopd.core.reproducible import CPU_ENV, pin_cpu_environment

ROOT = Path(__file__).resolve().parents[2]


def test_pin_sets_what_is_missing_and_keeps_what_the_user_set():
    env = {"MKL_CBWR": "COMPATIBLE", "PATH": "/bin"}
    got = pin_cpu_environment(env)
    assert got["MKL_CBWR"] == "COMPATIBLE" and env["MKL_CBWR"] == "COMPATIBLE"
    for k, v in CPU_ENV.items():
        if k != "MKL_CBWR":
            assert env[k] == v and got[k] == v
    assert env["PATH"] == "/bin" and set(got) == set(CPU_ENV)


def test_cli_pins_the_environment_before_torch_loads():
    """A command that asks for it (``pin_cpu=True``: `mopd demo`, `mopd world ...`) gets the pinned
    variables in its handler's process, torch not yet loaded when they are set; another command
    leaves the environment alone."""
    code = ("import os, sys\n"
            "import mopd.cli, mopd.commands as mc\n"
            "def handler(args):\n"
            "    print('torch' in sys.modules, os.environ.get('MKL_CBWR'))\n"
            "real = mc.register\n"
            "def register(sub):\n"
            "    real(sub)\n"
            "    sub.add_parser('pinned').set_defaults(func=handler, pin_cpu=True)\n"
            "mc.register, mc._list = register, handler\n"   # read by build_parser, which main() calls
            "mopd.cli.main(['config', 'list'])\n"
            "mopd.cli.main(['pinned'])\n")
    env = {k: v for k, v in os.environ.items() if k not in CPU_ENV}
    out = subprocess.run([sys.executable, "-c", code], env=env | {"PYTHONPATH": str(ROOT)}, capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "None", "False", CPU_ENV["MKL_CBWR"]]


@pytest.mark.parametrize("threads", [1, 2])
def test_deterministic_torch_sets_threads_and_deterministic_mode(threads):
    import torch

    from mopd.core.reproducible import deterministic_torch

    before = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled())
    try:
        deterministic_torch(threads)
        assert torch.get_num_threads() == threads and torch.are_deterministic_algorithms_enabled()
    finally:
        torch.set_num_threads(before[0])
        torch.use_deterministic_algorithms(before[1])
