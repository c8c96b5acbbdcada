"""CPU benchmarks of ``mopd.kernels``: the chunked torch path against the naive reference.

Target (docs/architecture.md, "Performance targets", CPU): peak memory at most 1/4 of the naive path
(materialised logits), time at most 1.2x.
Two operations, each at T=4096, H=512, V=32768 and at a larger T=8192, H=256, V=50257 (fp32):

- ``loss``: ``FusedLinearPolicyLoss`` forward + backward (three roles, entropy and KL terms);
- ``scoring``: ``linear_logprobs`` under ``torch.no_grad`` (the pi_old / teacher pass).

pytest-benchmark (``.venv/bin/pytest -q bench/bench_kernels.py --benchmark-only``) times each
path in its own test, grouped so that its table shows the torch/reference time ratio; peak memory
(``mopd.kernels.memtrack``, one extra untimed run) goes into ``extra_info``. As a script
(``.venv/bin/python bench/bench_kernels.py [--rounds N] [--shapes base,large]``) it alternates
the two paths round by round, which is fairer on a shared machine, and prints the RESULTS.md rows.
"""

from __future__ import annotations

import argparse
import statistics
import time

import pytest
import torch

from mopd.kernels import FusedLinearPolicyLoss, LossInputs, PolicyLossSettings, RoleSpec, linear_logprobs
from mopd.kernels.memtrack import TensorMemoryTracker

SHAPES = {"base": (4096, 512, 32768), "large": (8192, 256, 50257)}
ROUNDS = {"base": 3, "large": 2}
SPECS = [
    RoleSpec("outcome", entropy_coef=1e-3, kl_coef=1e-2, kl_type="k3"),
    RoleSpec("opd", opd_coef=0.01, entropy_coef=1e-3),
    RoleSpec("outcome", entropy_coef=1e-3, kl_coef=1e-2, kl_type="k1"),
]


def make_inputs(T, H, V, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(T, H, generator=g)
    weight = torch.randn(V, H, generator=g) / H ** 0.5 * 4
    targets = torch.randint(0, V, (T,), generator=g)
    with torch.no_grad():
        logp, _ = linear_logprobs(hidden, weight, targets, backend="torch")
    return dict(hidden=hidden, weight=weight, targets=targets,
                old_logp=logp + 0.1 * torch.randn(T, generator=g),
                advantages=torch.randn(T, generator=g), roles=torch.randint(-1, 3, (T,), generator=g),
                teacher_logp=logp - torch.rand(T, generator=g),
                ref_logp=logp + 0.1 * torch.randn(T, generator=g))


def op_fn(op, backend, inp):
    if op == "scoring":
        def scoring():
            with torch.no_grad():
                linear_logprobs(inp["hidden"], inp["weight"], inp["targets"], backend=backend)
        return scoring

    h = inp["hidden"].clone().requires_grad_(True)
    w = inp["weight"].clone().requires_grad_(True)

    inputs = LossInputs(inp["roles"], inp["old_logp"], inp["advantages"], inp["teacher_logp"],
                        inp["ref_logp"])
    loss_fn = FusedLinearPolicyLoss(PolicyLossSettings(SPECS, backend=backend))

    def loss_fwd_bwd():
        h.grad = w.grad = None
        loss, _ = loss_fn(h, w, inp["targets"], inputs)
        loss.backward()
    return loss_fwd_bwd


def peak_bytes(fn):
    with TensorMemoryTracker() as mem:
        fn()
    return mem.peak_bytes


# ---------------------------------------------------------------------------------------------
# pytest-benchmark
# ---------------------------------------------------------------------------------------------

_INPUTS = {}
_PEAKS = {}


def _inputs(shape):
    if shape not in _INPUTS:
        _INPUTS.clear()
        _INPUTS[shape] = make_inputs(*SHAPES[shape])
    return _INPUTS[shape]


@pytest.mark.parametrize("backend", ["reference", "torch"])
@pytest.mark.parametrize("op", ["loss", "scoring"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_torch_path_vs_reference(benchmark, shape, op, backend):
    T, H, V = SHAPES[shape]
    benchmark.group = f"{op} T={T} H={H} V={V}"
    fn = op_fn(op, backend, _inputs(shape))
    peak = peak_bytes(fn)
    _PEAKS[(shape, op, backend)] = peak
    benchmark.extra_info["peak_mib"] = round(peak / 2**20, 1)
    ref = _PEAKS.get((shape, op, "reference"))
    if backend == "torch" and ref:
        benchmark.extra_info["peak_vs_reference"] = round(peak / ref, 4)
    benchmark.pedantic(fn, rounds=ROUNDS[shape], iterations=1, warmup_rounds=0)


# ---------------------------------------------------------------------------------------------
# Script: alternating rounds, RESULTS.md rows
# ---------------------------------------------------------------------------------------------


def measure(shape, op, rounds):
    inp = make_inputs(*SHAPES[shape])
    fns = {b: op_fn(op, b, inp) for b in ("reference", "torch")}
    times = {b: [] for b in fns}
    for _ in range(rounds):
        for b, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[b].append(time.perf_counter() - t0)
    peaks = {b: peak_bytes(fn) for b, fn in fns.items()}
    med = {b: statistics.median(v) for b, v in times.items()}
    return dict(ref_s=med["reference"], torch_s=med["torch"], time_ratio=med["torch"] / med["reference"],
                ref_peak_mib=peaks["reference"] / 2**20, torch_peak_mib=peaks["torch"] / 2**20,
                mem_ratio=peaks["torch"] / peaks["reference"], times=times)


def main():
    p = argparse.ArgumentParser(description="chunked torch path vs naive reference, CPU")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--shapes", default="base,large")
    p.add_argument("--ops", default="loss,scoring")
    args = p.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| op | T, H, V | reference time | torch time | time ratio | reference peak | torch peak "
          "| memory ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        for op in args.ops.split(","):
            r = measure(shape, op, args.rounds)
            T, H, V = SHAPES[shape]
            print(f"| {op} | {T}, {H}, {V} | {r['ref_s']:.2f} s | {r['torch_s']:.2f} s | "
                  f"{r['time_ratio']:.2f}x | {r['ref_peak_mib']:.0f} MiB | {r['torch_peak_mib']:.0f} MiB | "
                  f"{r['mem_ratio']:.3f} |", flush=True)
            print(f"<!-- rounds (s): reference {[round(x, 2) for x in r['times']['reference']]}, "
                  f"torch {[round(x, 2) for x in r['times']['torch']]} -->", flush=True)


if __name__ == "__main__":
    main()
