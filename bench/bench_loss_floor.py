"""The CPU loss head against its floor: the bare lm-head matmuls it cannot avoid.

For each shape and thread count, one fresh process alternates the variants round by round (the
order rotates each round) and reports medians (the slow baselines, naive and Liger, are timed in
the first ``--baseline-rounds`` rounds only):

- ``scoring``: ``linear_logprobs(..., with_entropy=False)`` under ``torch.no_grad`` (the pi_old /
  teacher pass). Floor: **one matmul**, ``h_c @ W^T`` chunk by chunk into the same reused buffer,
  with the chunk rows the pass itself uses (``chunked.chunk_rows_for``). Naive: materialised
  logits, ``log_softmax(h @ W^T / t).gather(targets)``.
- ``loss``: ``FusedLinearPolicyLoss`` forward + backward. Floor: **the three matmuls** of the same
  chunks of trained rows (logits ``h_c @ W^T``, ``grad_h = dl @ W``, ``grad_W += dl^T h_c``). Naive:
  the ``reference`` backend (full logits, autograd). Liger: ``LigerFusedLinearGRPOLoss`` eager
  (``compiled=False``) on the same GRPO loss (``--loss grpo``, bench_kernels.py's ``--vs-liger``
  set-up: clipped surrogate, k3 KL with beta 0.04, 1/4 of tokens masked). ``--loss roles`` runs
  bench_kernels.py's three-role loss with entropy terms instead (no Liger equivalent).
- ``eager``: ours with the compiled row pass switched off (``MOPD_KERNELS_COMPILE=0``), the library's
  default (the compiled pass is opt-in): the targets are on this one. ``eager_entropy``: the eager
  scoring pass with the entropy as well (``with_entropy=True``).

Each row prints the medians and the ratios ``ours / floor``, ``eager / floor``, ``ours / naive``
and ``ours / Liger``. Compilation (the first call of ours) happens in an untimed warm-up.

    .venv/bin/python bench/bench_loss_floor.py                       # both shapes, 1 and 2 threads
    .venv/bin/python bench/bench_loss_floor.py --shapes large --threads 2 --rounds 5
    .venv/bin/python bench/bench_loss_floor.py --baselines ""        # floors only (fastest)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from mopd_kernels import FusedLinearPolicyLoss, LossInputs, PolicyLossSettings, RoleSpec, linear_logprobs
from mopd_kernels.compiled_rows import set_compiled_cpu_rows
from mopd_kernels.chunked import TorchRowPass, chunk_rows_for

SHAPES = {"base": (4096, 512, 32768), "large": (8192, 256, 50257), "xl": (4096, 1024, 151936)}
SEQ_LEN = 512
LIGER_BETA = 0.04
TEMPERATURE = 1.0
ROLE_SPECS = [  # bench_kernels.py's three roles
    RoleSpec("outcome", entropy_coef=1e-3, kl_coef=1e-2, kl_type="k3"),
    RoleSpec("opd", opd_coef=0.01, entropy_coef=1e-3),
    RoleSpec("outcome", entropy_coef=1e-3, kl_coef=1e-2, kl_type="k1"),
]

set_compiled_cpu_rows(True)  # a benchmark is a long job: the compiled CPU row pass, as the trainer runs it


def make_inputs(T, H, V, loss_kind, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(T, H, generator=g)
    weight = torch.randn(V, H, generator=g) / H ** 0.5 * 4
    targets = torch.randint(0, V, (T,), generator=g)
    with torch.no_grad():
        logp, _ = linear_logprobs(hidden, weight, targets, with_entropy=False)
    old = logp + 0.1 * torch.randn(T, generator=g)
    ref = logp + 0.1 * torch.randn(T, generator=g)
    if loss_kind == "grpo":
        mask = torch.rand(T, generator=g) >= 0.25
        seq_adv = torch.randn(T // SEQ_LEN, generator=g)
        roles = torch.where(mask, 0, -1)
        inputs = LossInputs(roles, old, seq_adv.repeat_interleave(SEQ_LEN), ref_logp=ref)
        specs = [RoleSpec("outcome", kl_coef=LIGER_BETA, kl_type="k3")]
    else:
        mask, seq_adv = None, None
        roles = torch.randint(-1, 3, (T,), generator=g)
        inputs = LossInputs(roles, old, torch.randn(T, generator=g), logp - torch.rand(T, generator=g), ref)
        specs = ROLE_SPECS
    return dict(hidden=hidden, weight=weight, targets=targets, inputs=inputs, specs=specs, mask=mask,
                seq_adv=seq_adv, old=old, ref=ref)


# ---------------------------------------------------------------------------------------------
# The variants: each a closure making one call
# ---------------------------------------------------------------------------------------------


def chunk_rows(n, H, V):
    return chunk_rows_for(n, V, TorchRowPass.bytes_per_logit(torch.float32), torch.device("cpu"), H=H,
                          element_size=4)


def scoring_floor(inp):
    h, w = inp["hidden"], inp["weight"]
    T, H = h.shape
    V = w.shape[0]
    C = chunk_rows(T, H, V)
    wt = w.t()

    def one_matmul():
        buf = torch.empty(C, V)
        for s in range(0, T, C):
            e = min(T, s + C)
            torch.mm(h[s:e], wt, out=buf[: e - s])
    return one_matmul


def scoring_ours(inp, with_entropy=False):
    def scoring():
        with torch.no_grad():
            linear_logprobs(inp["hidden"], inp["weight"], inp["targets"], temperature=TEMPERATURE,
                            with_entropy=with_entropy)
    return scoring


def scoring_naive(inp):
    def naive():
        with torch.no_grad():
            logits = (inp["hidden"] @ inp["weight"].T).float() / TEMPERATURE
            torch.log_softmax(logits, dim=-1).gather(1, inp["targets"].unsqueeze(1))
    return naive


def loss_floor(inp):
    h, w = inp["hidden"], inp["weight"]
    index = (inp["inputs"].roles >= 0).nonzero().squeeze(1)
    h_a = h.index_select(0, index)
    n, H = h_a.shape
    V = w.shape[0]
    C = chunk_rows(n, H, V)
    wt = w.t()

    def three_matmuls():
        buf = torch.empty(C, V)
        grad_h = torch.zeros(n, H)
        grad_w = torch.zeros_like(w)
        for s in range(0, n, C):
            e = min(n, s + C)
            z = torch.mm(h_a[s:e], wt, out=buf[: e - s])
            grad_h[s:e].addmm_(z, w, beta=0.0)
            grad_w.addmm_(z.t(), h_a[s:e])
    return three_matmuls


def loss_ours(inp, backend="auto"):
    h = inp["hidden"].clone().requires_grad_(True)
    w = inp["weight"].clone().requires_grad_(True)
    loss_fn = FusedLinearPolicyLoss(PolicyLossSettings(inp["specs"], temperature=TEMPERATURE, backend=backend))

    def fwd_bwd():
        h.grad = w.grad = None
        loss, _ = loss_fn(h, w, inp["targets"], inp["inputs"])
        loss.backward()
    return fwd_bwd


def loss_liger(inp):
    from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

    T, H = inp["hidden"].shape
    B = T // SEQ_LEN
    h = inp["hidden"].clone().requires_grad_(True)
    w = inp["weight"].clone().requires_grad_(True)
    liger = LigerFusedLinearGRPOLoss(beta=LIGER_BETA, compiled=False, temperature=TEMPERATURE)

    def fwd_bwd():
        h.grad = w.grad = None
        loss, _ = liger(h.view(B, SEQ_LEN, H), w, inp["targets"].view(B, -1), inp["mask"].view(B, -1).long(),
                        inp["seq_adv"], ref_per_token_logps=inp["ref"].view(B, -1),
                        old_per_token_logps=inp["old"].view(B, -1))
        loss.backward()
    return fwd_bwd


def with_compile_off(fn):
    def eager():
        os.environ["MOPD_KERNELS_COMPILE"] = "0"
        try:
            fn()
        finally:
            os.environ.pop("MOPD_KERNELS_COMPILE")
    return eager


def variants(op, inp, baselines):
    if op == "scoring":
        out = {"floor": scoring_floor(inp), "ours": scoring_ours(inp)}
        out["eager"] = with_compile_off(scoring_ours(inp))
        out["eager_entropy"] = with_compile_off(scoring_ours(inp, with_entropy=True))
        if "naive" in baselines:
            out["naive"] = scoring_naive(inp)
        return out
    out = {"floor": loss_floor(inp), "ours": loss_ours(inp)}
    out["eager"] = with_compile_off(loss_ours(inp))
    if "naive" in baselines:
        out["naive"] = loss_ours(inp, backend="reference")
    if "liger" in baselines and inp["mask"] is not None:
        out["liger"] = loss_liger(inp)
    return out


# ---------------------------------------------------------------------------------------------
# One process: one shape, one thread count, all ops
# ---------------------------------------------------------------------------------------------


CORE = ("floor", "ours", "eager", "eager_entropy")


def run_child(shape, threads, ops, rounds, baselines, loss_kind, baseline_rounds):
    """Core variants (floor, ours, eager) every round after one untimed warm-up call each (it
    compiles the row pass); the baselines (slow: naive, Liger) in the first ``baseline_rounds``."""
    torch.set_num_threads(threads)
    T, H, V = SHAPES[shape]
    inp = make_inputs(T, H, V, loss_kind)
    for op in ops:
        fns = variants(op, inp, baselines)
        for k in CORE:
            if k in fns:
                fns[k]()
        times = {k: [] for k in fns}
        for r in range(rounds):
            names = [k for k in fns if k in CORE or r < baseline_rounds]
            order = names[r % len(names):] + names[: r % len(names)]
            for k in order:
                t0 = time.perf_counter()
                fns[k]()
                times[k].append(time.perf_counter() - t0)
        out = dict(shape=shape, threads=threads, op=op, loss=loss_kind, load=os.getloadavg()[0],
                   median={k: statistics.median(v) for k, v in times.items()}, times=times)
        print("RESULT " + json.dumps(out), flush=True)


def print_table(results):
    print("| op | T, H, V | threads | floor | eager (default) | eager / floor | eager + entropy / floor | "
          "compiled / floor | naive | eager / naive | Liger eager | eager / Liger | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        m = r["median"]
        T, H, V = SHAPES[r["shape"]]
        name = "no-grad scoring" if r["op"] == "scoring" else f"loss fwd+bwd ({r['loss']})"

        def cell(k, ratio_to=None):
            if k not in m:
                return "-"
            return f"{m[k] / m[ratio_to]:.3f}x" if ratio_to else f"{m[k]:.2f} s"
        print(f"| {name} | {T}, {H}, {V} | {r['threads']} | {cell('floor')} | {cell('eager')} | "
              f"**{cell('eager', 'floor')}** | {cell('eager_entropy', 'floor')} | {cell('ours', 'floor')} | "
              f"{cell('naive')} | {cell('eager', 'naive') if 'naive' in m else '-'} | {cell('liger')} | "
              f"{cell('eager', 'liger') if 'liger' in m else '-'} | {r['load']:.1f} |", flush=True)
    for r in results:
        print(f"<!-- {r['shape']} {r['op']} {r['threads']} threads, rounds (s): "
              + "; ".join(f"{k} {[round(x, 3) for x in v]}" for k, v in r["times"].items()) + " -->")


def main():
    p = argparse.ArgumentParser(description="the CPU loss head against its bare matmuls, naive logits and Liger")
    p.add_argument("--shapes", default="base,large", help=f"comma-separated, of {sorted(SHAPES)}")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--ops", default="scoring,loss")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--baselines", default="naive,liger", help="which of naive,liger to time too")
    p.add_argument("--baseline-rounds", type=int, default=1, help="rounds that time the baselines (slow)")
    p.add_argument("--loss", choices=["grpo", "roles"], default="grpo")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    ops, baselines = a.ops.split(","), [b for b in a.baselines.split(",") if b]
    if a.child:
        run_child(a.shapes, int(a.threads), ops, a.rounds, baselines, a.loss, a.baseline_rounds)
        return
    print(f"torch {torch.__version__}; {a.rounds} rounds; load average {os.getloadavg()[0]:.1f} at start",
          flush=True)
    results = []
    for shape in a.shapes.split(","):
        for threads in a.threads.split(","):
            cmd = [sys.executable, __file__, "--child", "--shapes", shape, "--threads", threads, "--ops", a.ops,
                   "--rounds", str(a.rounds), "--baselines", a.baselines, "--loss", a.loss,
                   "--baseline-rounds", str(a.baseline_rounds)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            if proc.returncode or not lines:
                raise SystemExit(f"{shape} at {threads} threads failed:\n{proc.stderr[-3000:]}")
            for line in lines:
                r = json.loads(line[len("RESULT "):])
                results.append(r)
                print(f"  {r['shape']} {r['op']} {r['threads']} threads: "
                      + ", ".join(f"{k} {v:.2f} s" for k, v in r["median"].items()), flush=True)
    print_table(results)


if __name__ == "__main__":
    main()
