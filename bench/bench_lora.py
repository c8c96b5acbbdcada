"""Memory and step time of LoRA against full fine-tuning, on the CPU, in one process (issue 52).

    .venv/bin/python bench/bench_lora.py                      # SmolLM2-135M (make real-model), rank 16
    .venv/bin/python bench/bench_lora.py --model DIR --rank 8 --tokens 512 --repeats 3 --json out.json

For each variant (LoRA first, then full fine-tuning: what the allocator keeps after a variant is
reused by the next, so the smaller one goes first and each is measured against the resident size
just before it) the model is loaded as the trainer loads it (``load_causal_lm``, float32 on a CPU;
LoRA: ``mopd.train.lora.add_adapters``, the base frozen, the adapters fp32 with their own AdamW),
and one fixed packed micro-batch of random agent calls goes through the trainer's update: the packed
forward, the fused policy loss head (``FusedLinearPolicyLoss``: PPO on two roles, OPD on one),
backward, AdamW step. Reported per variant: trainer-state bytes (parameters, gradients, AdamW
moments), the peak resident size during the steps (sampled every millisecond) above the size before
the model was loaded, and the median step time of ``--repeats`` steps after one warm-up.

On a CPU the base stays float32 (the compute dtype there); on a GPU it is held in bf16, so the
parameter bytes there halve as well (``mopd plan`` counts that case). One JSON line is printed (and
written to ``--json``): the numbers and the LoRA / full ratios.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "kernels"))
DEFAULT_MODEL = ROOT / ".cache" / "real-models" / "smollm2-135m-instruct"
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    """The resident set size of this process now, in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def trim() -> None:
    """Give freed heap back to the OS (glibc), so the next variant starts from what is really held."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakSampler:
    """The largest RSS seen while it runs (a thread sampling every millisecond)."""

    def __enter__(self):
        self.peak, self._stop = rss(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())


def make_batch(vocab: int, tokens: int, seed: int):
    """Random agent calls of 60-400 tokens filling ``tokens``, half of each call trained (roles 0-2),
    as one packed micro-batch with old and teacher log-probs."""
    from mopd.train.packing import build_packed_batch

    rng = random.Random(seed)
    seqs, left = [], tokens
    while left > 0:
        n = min(left, rng.randint(60, 400))
        left -= n
        toks = [rng.randrange(vocab) for _ in range(n)]
        roles = [-1] * (n // 2) + [rng.choice([0, 1, 2])] * (n - n // 2)
        seqs.append((toks, roles, [rng.uniform(-1, 1)] * n, [-rng.uniform(0.5, 3)] * n))
    batch = build_packed_batch(*zip(*seqs))
    batch.old_logp, batch.teacher_logp = batch.sampling_logp, batch.sampling_logp - 0.1
    return batch


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def train_step(policy, loss_fn, batch, norm: float, opt, record=None) -> float:
    """Forward, fused loss, backward, AdamW step; its seconds. ``record`` gets the gradients' bytes."""
    t0 = time.perf_counter()
    loss, _ = policy(batch, loss_fn, normalizer=norm)
    loss.backward()
    if record is not None:
        record["grad_bytes"] = nbytes(p.grad for p in policy.parameters() if p.grad is not None)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def run_variant(model_dir: str, rank: int, tokens: int, repeats: int, seed: int) -> dict:
    import torch

    from mopd.config.inputs import LoraConfig
    from mopd.train import lora
    from mopd.train.model import PackedCausalLM, load_causal_lm
    from mopd_kernels import FusedLinearPolicyLoss, PolicyLossSettings, RoleSpec

    trim()
    before = rss()
    torch.manual_seed(seed)
    with PeakSampler() as peak:
        model, _ = load_causal_lm(model_dir, dtype=torch.float32, device=torch.device("cpu"))
        if rank > 0:
            lora.add_adapters(model, LoraConfig(rank=rank, alpha=2.0 * rank), model_dir)
        trainable = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(trainable, lr=1e-4 if rank > 0 else 1e-6)
        policy = PackedCausalLM(model)
        loss_fn = FusedLinearPolicyLoss(PolicyLossSettings(role_specs=[RoleSpec(entropy_coef=1e-3),
                                                                       RoleSpec(advantage="opd"), RoleSpec()]))
        batch = make_batch(model.config.vocab_size, tokens, seed)
        norm = float(batch.loss_tokens)
        loaded = rss()
        state = {}
        warmup = train_step(policy, loss_fn, batch, norm, opt, state)
        times = [train_step(policy, loss_fn, batch, norm, opt) for _ in range(repeats)]
    params = list(model.parameters())
    res = {
        "variant": f"lora_r{rank}" if rank > 0 else "full",
        "params": sum(p.numel() for p in params),
        "trainable_params": sum(p.numel() for p in trainable),
        "param_bytes": nbytes(params),
        "grad_bytes": state["grad_bytes"],
        "adamw_bytes": nbytes(v for s in opt.state.values() for v in s.values()
                              if isinstance(v, torch.Tensor) and v.dim() > 0),
        "rss_loaded_bytes": loaded - before,
        "rss_peak_bytes": peak.peak - before,
        "warmup_s": round(warmup, 3),
        "step_s_median": round(statistics.median(times), 3),
        "step_s_all": [round(t, 3) for t in times],
    }
    res["state_bytes"] = res["param_bytes"] + res["grad_bytes"] + res["adamw_bytes"]
    del model, policy, opt, trainable, params, batch
    trim()
    return res


def fallback_model() -> str:
    """The largest tiny model that is quick to make here, when SmolLM2 is not converted."""
    import tempfile

    from tests.helpers.tiny_model import init_tiny_model

    d = Path(tempfile.mkdtemp(prefix="mopd_bench_lora_")) / "model"
    return str(init_tiny_model(d, hidden=512, layers=8, heads=8, ffn=1536, seed=0))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help=f"model directory (default: {DEFAULT_MODEL.relative_to(ROOT)}, "
                                                  "else a tiny model made here)")
    p.add_argument("--rank", type=int, default=16, help="LoRA rank (alpha = 2 x rank)")
    p.add_argument("--tokens", type=int, default=1024, help="tokens in the packed micro-batch")
    p.add_argument("--repeats", type=int, default=5, help="timed steps per variant (after one warm-up)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the result here")
    a = p.parse_args(argv)
    if a.rank < 1 or a.tokens < 2 or a.repeats < 1:
        p.error("--rank, --repeats must be >= 1 and --tokens >= 2")
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    model_dir = a.model or (str(DEFAULT_MODEL) if (DEFAULT_MODEL / "config.json").is_file() else fallback_model())
    if not Path(model_dir, "config.json").is_file():
        p.error(f"--model {model_dir}: not a model directory")
    load_before = os.getloadavg()
    lora_res = run_variant(model_dir, a.rank, a.tokens, a.repeats, a.seed)
    full_res = run_variant(model_dir, 0, a.tokens, a.repeats, a.seed)
    ratio = {k: round(lora_res[k] / full_res[k], 4) for k in
             ("trainable_params", "param_bytes", "grad_bytes", "adamw_bytes", "state_bytes", "rss_peak_bytes",
              "step_s_median") if full_res[k]}
    out = {"model": Path(model_dir).name, "tokens": a.tokens, "repeats": a.repeats, "torch_threads":
           torch.get_num_threads(), "cpus": os.cpu_count(), "loadavg_before": load_before,
           "lora": lora_res, "full": full_res, "lora_over_full": ratio}
    out["loadavg_after"] = os.getloadavg()
    line = json.dumps(out)
    print(line, flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
