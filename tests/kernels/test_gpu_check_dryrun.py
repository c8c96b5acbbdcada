"""bench/gpu_check.sh --dry-run: the GPU check's CPU self-check (interpreter, tiny shapes), so the
script a GPU session will run with one command cannot rot unnoticed."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_check_dry_run(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(tmp_path), TRITON_INTERPRET="1")
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--dry-run"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "PASS gpu_kernels dry run (0 failed check(s)" in out
    assert "FAIL" not in out
    summary = json.loads((tmp_path / "kernels_gpu.json").read_text())
    assert summary["dry_run"] is True and summary["ok"] is True and summary["failed_checks"] == []
    assert summary["complete"] is True
    assert len(summary["correctness"]) == 4  # two shapes x (fp32, bf16)
    for key in ("floor_3mm_ms", "fused_triton_ms", "chunked_torch_ms", "scoring_triton_ms",
                "fused_peak_extra_net_of_grads_gib"):
        assert summary["timings"][key] is not None
    assert set(summary["targets"]) and all("met" in t for t in summary["targets"].values())
    assert (tmp_path / "kernels_gpu.log").read_text().count("PASS") >= 16
    assert "PASS train_step\n" in out and "PASS train_step_lora" in out   # the full and the LoRA step
    lora_step = json.loads((tmp_path / "train_step_lora.json").read_text())
    assert lora_step["lora_rank"] == 16 and 0 < lora_step["trainable_params_m"] < lora_step["params_m"]
