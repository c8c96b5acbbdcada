"""CPU benchmarks of ``mopd_kernels``: the chunked torch path against the naive reference.

Target (docs/architecture.md, "Performance targets", CPU): peak memory at most 1/4 of the naive path
(materialised logits), time at most 1.2x.
Two operations, each at T=4096, H=512, V=32768 and at a larger T=8192, H=256, V=50257 (fp32):

- ``loss``: ``FusedLinearPolicyLoss`` forward + backward (three roles, entropy and KL terms);
- ``scoring``: ``linear_logprobs`` under ``torch.no_grad`` (the pi_old / teacher pass).

pytest-benchmark (``.venv/bin/pytest -q bench/bench_kernels.py --benchmark-only``) times each
path in its own test, grouped so that its table shows the torch/reference time ratio; peak memory
(``mopd_kernels.memtrack``, one extra untimed run) goes into ``extra_info``. memtrack is a dispatch
mode, under which the torch path runs its eager row pass (``compiled_rows``): the peaks are the
eager pass's; the compiled pass holds no more (``--vs-liger`` measures its peak RSS). As a script
(``.venv/bin/python bench/bench_kernels.py [--rounds N] [--shapes base,large]``) it alternates
the two paths round by round, which is fairer on a shared machine, and prints the RESULTS.md rows.
"""

from __future__ import annotations

import argparse
import statistics
import time

import pytest
import torch

from mopd_kernels import FusedLinearPolicyLoss, LossInputs, PolicyLossSettings, RoleSpec, linear_logprobs
from mopd_kernels.compiled_rows import set_compiled_cpu_rows
from mopd_kernels.memtrack import TensorMemoryTracker

SHAPES = {"base": (4096, 512, 32768), "large": (8192, 256, 50257)}
ROUNDS = {"base": 3, "large": 2}
SPECS = [
    RoleSpec("outcome", entropy_coef=1e-3, kl_coef=1e-2, kl_type="k3"),
    RoleSpec("opd", opd_coef=0.01, entropy_coef=1e-3),
    RoleSpec("outcome", entropy_coef=1e-3, kl_coef=1e-2, kl_type="k1"),
]

set_compiled_cpu_rows(True)  # a benchmark is a long job: the compiled CPU row pass, as the trainer runs it


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
    if backend == "torch":
        fn()  # compiles the CPU row pass (compiled_rows) outside the timed rounds
    benchmark.pedantic(fn, rounds=ROUNDS[shape], iterations=1, warmup_rounds=0)


# ---------------------------------------------------------------------------------------------
# Script: alternating rounds, RESULTS.md rows
# ---------------------------------------------------------------------------------------------


def measure(shape, op, rounds):
    inp = make_inputs(*SHAPES[shape])
    fns = {b: op_fn(op, b, inp) for b in ("reference", "torch")}
    times = {b: [] for b in fns}
    fns["torch"]()  # compiles the CPU row pass (compiled_rows) outside the timed rounds
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


# ---------------------------------------------------------------------------------------------
# Against Liger's LigerFusedLinearGRPOLoss: same loss, same inputs, a fresh process per run
# ---------------------------------------------------------------------------------------------
#
# Both systems compute the same GRPO loss (clipped surrogate with per-sequence advantages, k3 KL
# to a reference with beta=0.04, token mean over the trained tokens, ~1/4 of tokens masked), ours
# as one outcome role with kl_coef=beta at the defaults (backend "auto", chunks from the default
# sizing), Liger's with its defaults (compiled loss maths, chunk_size=1 sequence, loss_type "dapo").
# Tokens are B sequences of SEQ_LEN; Liger takes them as [B, SEQ_LEN, H].
#
# Memory is the peak RSS of the call: each run is a fresh process with glibc's mmap threshold fixed
# at 128 KiB (so a freed tensor goes back to the kernel at once, and RSS follows live tensors);
# after a warm-up call on one sequence at the measured shape (which compiles Liger's loss maths and
# our compiled row pass) the process resets
# its RSS high-water mark (``/proc/self/clear_refs``), notes its RSS, makes the call (forward +
# backward, gradients kept) and reads ``VmHWM``: peak = VmHWM - RSS before. Everything the call
# allocates counts, whoever allocates it (tensors, autograd, compiled code, BLAS scratch).

VS_LIGER_SHAPES = {"base": (4096, 512, 32768), "large": (8192, 256, 50257), "xl": (4096, 1024, 151936)}
SEQ_LEN = 512
LIGER_BETA = 0.04
REF_DIR = "/tmp/mopd_bench_vs_liger"


def grpo_inputs(T, H, V, seed=0):
    """Hidden, weight, targets, token mask and per-sequence advantages of one micro-batch (no logps)."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(T, H, generator=g)
    weight = torch.randn(V, H, generator=g) / H ** 0.5 * 4
    targets = torch.randint(0, V, (T,), generator=g)
    mask = torch.rand(T, generator=g) >= 0.25
    seq_adv = torch.randn(T // SEQ_LEN, generator=g)
    noise_old, noise_ref = torch.randn(T, generator=g), torch.randn(T, generator=g)
    return dict(hidden=hidden, weight=weight, targets=targets, mask=mask, seq_adv=seq_adv,
                noise_old=noise_old, noise_ref=noise_ref)


def fp64_grpo_reference(inp, rows=256):
    """The GRPO loss and its gradients in fp64 by plain autograd, a block of rows at a time (each
    row's softmax is whole in its block; the token mean's denominator is the global count). Also
    draws old/ref log-probs near the true ones: old = logp + 0.1 noise, ref = logp + 0.1 noise."""
    h = inp["hidden"].double().requires_grad_(True)
    w = inp["weight"].double().requires_grad_(True)
    T = h.shape[0]
    n = int(inp["mask"].sum())
    adv = inp["seq_adv"].double().repeat_interleave(SEQ_LEN)
    old = torch.empty(T, dtype=torch.float64)
    ref = torch.empty(T, dtype=torch.float64)
    total = 0.0
    for s in range(0, T, rows):
        e = min(T, s + rows)
        logp_all = torch.log_softmax(h[s:e] @ w.T, dim=1)
        logp = logp_all.gather(1, inp["targets"][s:e].unsqueeze(1)).squeeze(1)
        old[s:e] = logp.detach() + 0.1 * inp["noise_old"][s:e].double()
        ref[s:e] = logp.detach() + 0.1 * inp["noise_ref"][s:e].double()
        ratio = torch.exp(logp - old[s:e])
        A = adv[s:e]
        pg = torch.maximum(-A * ratio, -A * ratio.clamp(0.8, 1.2))
        d = ref[s:e] - logp
        tok = pg + LIGER_BETA * (torch.exp(d) - d - 1.0)
        block = (tok * inp["mask"][s:e].double()).sum() / n
        block.backward()
        total += float(block.detach())
    return dict(loss=torch.tensor(total, dtype=torch.float64), grad_h=h.grad, grad_w=w.grad,
                old=old.float(), ref=ref.float())


def _ref_path(shape, part):
    import os

    os.makedirs(REF_DIR, exist_ok=True)
    return f"{REF_DIR}/{shape}_{part}.pt"


def prepare_reference(shape):
    """Compute and store the fp64 reference of ``shape`` once: its old/ref log-probs (``logps``,
    read by every run) and the loss and gradients (``grads``, read after a checked run)."""
    import os

    if not os.path.exists(_ref_path(shape, "grads")):
        r = fp64_grpo_reference(grpo_inputs(*VS_LIGER_SHAPES[shape]))
        torch.save({k: r[k] for k in ("old", "ref")}, _ref_path(shape, "logps"))
        torch.save({k: r[k] for k in ("loss", "grad_h", "grad_w")}, _ref_path(shape, "grads") + ".tmp")
        os.replace(_ref_path(shape, "grads") + ".tmp", _ref_path(shape, "grads"))


def _system_fn(system, inp, old, ref):
    """A closure making one forward + backward of ``system``; returns the leaf tensors it grads."""
    T, H = inp["hidden"].shape
    B = T // SEQ_LEN
    h = inp["hidden"].clone().requires_grad_(True)
    w = inp["weight"].clone().requires_grad_(True)
    if system == "ours":
        roles = torch.where(inp["mask"], 0, -1)
        inputs = LossInputs(roles, old, inp["seq_adv"].repeat_interleave(SEQ_LEN), ref_logp=ref)
        loss_fn = FusedLinearPolicyLoss(PolicyLossSettings([RoleSpec("outcome", kl_coef=LIGER_BETA, kl_type="k3")]))

        def call():
            loss, _ = loss_fn(h, w, inp["targets"], inputs)
            loss.backward()
            return loss
    else:
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

        liger = LigerFusedLinearGRPOLoss(beta=LIGER_BETA)
        hb = h.view(B, SEQ_LEN, H)

        def call():
            loss, _ = liger(hb, w, inp["targets"].view(B, -1), inp["mask"].view(B, -1).long(), inp["seq_adv"],
                            ref_per_token_logps=ref.view(B, -1), old_per_token_logps=old.view(B, -1))
            loss.backward()
            return loss
    return call, h, w


def _status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


def run_child(system, shape, check):
    """One measured call of ``system`` at ``shape`` in this (fresh) process; prints one JSON line."""
    import gc
    import json

    T, H, V = VS_LIGER_SHAPES[shape]
    logps = torch.load(_ref_path(shape, "logps"))
    old, ref = logps["old"], logps["ref"]
    # Warm-up at the measured H and V on one sequence: compiles Liger's loss maths and our CPU row
    # pass (compiled_rows, V >= 8192) for these shapes, so neither compiles inside the measured call.
    warm = grpo_inputs(SEQ_LEN, H, V, seed=1)
    warm_call, _, _ = _system_fn(system, warm, old[:SEQ_LEN], ref[:SEQ_LEN])
    warm_call()
    inp = grpo_inputs(T, H, V)
    call, h, w = _system_fn(system, inp, old, ref)
    del warm, warm_call
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    base = _status_kib("VmRSS")
    t0 = time.perf_counter()
    loss = call()
    dt = time.perf_counter() - t0
    peak = _status_kib("VmHWM") - base
    out = dict(system=system, shape=shape, time_s=dt, peak_mib=peak / 1024, base_mib=base / 1024)
    if check:
        refs = torch.load(_ref_path(shape, "grads"))

        def rel(x, y):
            return float((x.double() - y).abs().max() / y.abs().max().clamp(min=1e-30))
        out.update(err_loss=rel(loss.detach(), refs["loss"]), err_grad_h=rel(h.grad, refs["grad_h"]),
                   err_grad_w=rel(w.grad, refs["grad_w"]))
    print("RESULT " + json.dumps(out), flush=True)


def vs_liger(shapes, rounds, env_extra=None):
    """Alternate fresh processes of both systems, round by round (the order flips each round)."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", **(env_extra or {}))
    rows = []
    for shape in shapes:
        prepare_reference(shape)
        runs = {"ours": [], "liger": []}
        for r in range(rounds):
            order = ["ours", "liger"] if r % 2 == 0 else ["liger", "ours"]
            for system in order:
                cmd = [sys.executable, __file__, "--child", system, "--shapes", shape] + (["--check"] if r == 0 else [])
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
                if proc.returncode or not line:
                    raise RuntimeError(f"{system} {shape} failed:\n{proc.stderr[-3000:]}")
                res = json.loads(line[0][7:])
                res["load"] = os.getloadavg()[0]
                runs[system].append(res)
                print("  " + json.dumps(res), flush=True)
        rows.append((shape, runs))
    return rows


def print_vs_liger(rows):
    print("| T, H, V | ours time | Liger time | time ratio | ours peak | Liger peak | memory ratio "
          "| max rel. error vs fp64 (ours; Liger): loss, grad_h, grad_w | load |")
    print("|---|---|---|---|---|---|---|---|---|")
    for shape, runs in rows:
        T, H, V = VS_LIGER_SHAPES[shape]
        med = {s: {k: statistics.median(x[k] for x in v) for k in ("time_s", "peak_mib")} for s, v in runs.items()}
        errs = {s: max((x for x in v if "err_loss" in x), key=lambda x: x["err_grad_w"]) for s, v in runs.items()}
        err = "; ".join(", ".join(f"{errs[s][k]:.1e}" for k in ("err_loss", "err_grad_h", "err_grad_w"))
                        for s in ("ours", "liger"))
        loads = [x["load"] for v in runs.values() for x in v]
        print(f"| {T}, {H}, {V} | {med['ours']['time_s']:.2f} s | {med['liger']['time_s']:.2f} s | "
              f"{med['ours']['time_s'] / med['liger']['time_s']:.2f}x | {med['ours']['peak_mib']:.0f} MiB | "
              f"{med['liger']['peak_mib']:.0f} MiB | {med['ours']['peak_mib'] / med['liger']['peak_mib']:.2f} | "
              f"{err} | {min(loads):.1f}-{max(loads):.1f} |", flush=True)
        for s, v in runs.items():
            print(f"<!-- {s} rounds: time {[round(x['time_s'], 2) for x in v]} s, "
                  f"peak {[round(x['peak_mib']) for x in v]} MiB -->")


if __name__ == "__main__":
    import sys

    if "--child" in sys.argv or "--vs-liger" in sys.argv:
        p = argparse.ArgumentParser(description="fused_linear_policy_loss vs LigerFusedLinearGRPOLoss, CPU")
        p.add_argument("--vs-liger", action="store_true")
        p.add_argument("--child", choices=["ours", "liger"])
        p.add_argument("--check", action="store_true")
        p.add_argument("--rounds", type=int, default=5)
        p.add_argument("--shapes", default="base,large")
        a = p.parse_args()
        if a.child:
            run_child(a.child, a.shapes, a.check)
        else:
            print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
            print_vs_liger(vs_liger(a.shapes.split(","), a.rounds))
    else:
        main()
