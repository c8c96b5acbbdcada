"""The README's "Reuse the fused loss in another trainer" example runs as printed (a copy-and-run
snippet that rots silently otherwise)."""

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_kernels_example_runs_in_a_fresh_process():
    section = README.read_text().split("## Reuse the fused loss in another trainer", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    proc = subprocess.run([sys.executable, "-c", code + "\nimport sys; assert 'mopd' not in sys.modules\n"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loss, entropy = (float(x) for x in proc.stdout.split())
    assert entropy > 0 and loss == loss
