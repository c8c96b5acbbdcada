"""`pip install ./kernels` into an environment that has only torch adds one distribution, mopd-kernels;
`import mopd_kernels` loads neither numpy nor transformers; the README's first example runs there; the
source tree is left as it was (no build/ or *.egg-info written into kernels/).
In the integration tier (make test-integrations): it builds a fresh virtual environment."""

import json
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

KERNELS = Path(__file__).resolve().parents[2]
TORCH = "torch==2.13.0"


def _pip(python, *args):
    return subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", *args], capture_output=True,
                          text=True, timeout=900, check=True).stdout


def _tree(root: Path) -> set:
    """Every path under ``root`` but bytecode caches (what an install could leave behind)."""
    return {str(p.relative_to(root)) for p in root.rglob("*") if "__pycache__" not in p.parts}


def _installed(python):
    return {d["name"].lower() for d in json.loads(_pip(python, "list", "--format=json"))}


def test_kernels_install_with_torch_alone(tmp_path):
    env = tmp_path / "env"
    venv.create(env, with_pip=True)
    python = env / "bin" / "python"
    _pip(python, "install", "-q", TORCH)
    before = _installed(python)
    tree = _tree(KERNELS)
    _pip(python, "install", "-q", str(KERNELS))
    added = _installed(python) - before
    assert added == {"mopd-kernels"}, added
    left = sorted(_tree(KERNELS) - tree)
    assert not left, f"pip install ./kernels wrote into the source tree: {left[:10]}"
    readme = (KERNELS / "README.md").read_text()
    example = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    check = ("import sys\nimport mopd_kernels\n"
             "assert 'numpy' not in sys.modules and 'transformers' not in sys.modules, sorted(sys.modules)\n"
             + example + "\nprint('example ok')\n")
    out = subprocess.run([str(python), "-c", check], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0 and "example ok" in out.stdout, out.stderr[-3000:]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
