"""Two processes, gloo, FSDP2 on CPU: the same code path as a multi-GPU run."""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).parent / "dist_worker.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(model, qa, out, *rest, timeout=600):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()),
           str(WORKER), str(model), str(qa), str(out), *rest]
    for old in Path(out).glob("result_rank*.json"):
        old.unlink()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return [json.loads((Path(out) / f"result_rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
def test_two_rank_fsdp2_train_checkpoint_resume_export(tiny_model_dir, qa_file, tmp_path):
    from mopd.train.checkpoint import latest_checkpoint

    out = tmp_path / "run"
    r = torchrun(tiny_model_dir, qa_file, out)
    assert [x["step"] for x in r] == [2, 2]
    assert r[0]["digest"] == r[1]["digest"]            # ranks agree on the (gathered) weights
    assert r[0]["loss"] == r[1]["loss"]                # the loss is all-reduced
    ck = latest_checkpoint(out)
    assert ck.name == "step_000002" and (ck / "rng_rank1.pt").is_file()
    assert (out / "export" / "model.safetensors").is_file()
    r2 = torchrun(tiny_model_dir, qa_file, out, "resume")
    assert [x["start"] for x in r2] == [2, 2] and [x["step"] for x in r2] == [3, 3]
    assert r2[0]["digest"] != r[0]["digest"]           # step 3 moved the weights
    assert [x["best_digest"] for x in r2] == [r[0]["digest"]] * 2   # export "best" reloaded step 2 on both ranks
    assert (out / "export_best" / "model.safetensors").is_file()
    shutil.rmtree(out)
