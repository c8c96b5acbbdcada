"""Two ranks under torchrun, each with its own vLLM engine on vLLM's external launcher, on the
trainer's gloo group: `mopd train` runs its steps and the ranks leave cleanly (engine first)."""

import json
import os
import subprocess
import sys

from tests.helpers.vllm import require_vllm

require_vllm()

from tests.helpers.training import tiny_overrides  # noqa: E402
from tests.train.test_distributed import free_port  # noqa: E402


def test_two_ranks_train_on_their_own_external_launcher_engines(vllm_model_dir, quick_world, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           "-m", "mopd.cli", "train", "--steps", "2", "tiny_cmas_rl",
           *tiny_overrides(vllm_model_dir, quick_world.train, out),
           f"retriever.index={quick_world.index}", "rollout.engine=vllm", "trainer.old_logprobs=recompute"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd())
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "rollout/em" in r] == [1, 2]
    assert "external_launcher" in proc.stderr + proc.stdout            # each rank's engine joined the group
    for bad in ("Traceback", "Exception ignored"):
        assert bad not in proc.stderr, proc.stderr[-4000:]
