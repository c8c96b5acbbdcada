"""The linter that the README names passes on a clean clone, and CI runs it, so a lint error does not
land (``make lint`` failed on an unused import in a test file, and CI never ran it)."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _lint_command() -> list:
    """The command ``make lint`` runs, read from the Makefile (its ``$(BIN)/ruff`` is this venv's)."""
    recipe = re.search(r"^lint:.*\n\t(.+)$", (ROOT / "Makefile").read_text(), re.M).group(1).split()
    assert recipe[0].endswith("/ruff"), recipe
    return [sys.executable, "-m", "ruff", *recipe[1:]]


def test_make_lint_passes():
    command = _lint_command()
    assert command[3:4] == ["check"] and {"mopd", "kernels", "tests", "bench"} <= set(command)
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]


def test_ci_runs_the_linter_beside_the_tests():
    steps = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    assert "make test" in steps and "make lint" in steps
    assert steps.index("make lint") > steps.index("make setup")
