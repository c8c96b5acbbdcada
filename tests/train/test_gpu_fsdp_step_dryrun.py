"""bench/gpu_fsdp_step.py --dry-run: the GPU check's FSDP2 training path on CPU (gloo, tiny sizes),
so the script a GPU session runs with one command cannot rot unnoticed."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_fsdp_step_dry_run_passes_every_check(tmp_path):
    out = tmp_path / "fsdp_step.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_fsdp_step.py"), "--dry-run", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    assert "FAIL" not in text
    res = json.loads(out.read_text())
    assert res["checks"] and all(res["checks"].values())
    assert set(res["tokens_per_s"]) >= {"rollout", "score_old", "score_teacher", "train"}
    assert 0 < res["teacher_tokens_scored_frac"] < 1           # only the Searcher calls were scored
