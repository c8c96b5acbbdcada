"""How much does accumulating ``grad_W`` in bf16 across row chunks cost in precision?

``mopd_kernels``' chunk loops add each chunk's ``dlogits^T @ h_c`` into ``grad_W`` in the weight's
dtype: bf16 inputs round the running sum to bf16 once per chunk (about ten times at T=16,384 with
the 512 MiB CUDA chunk budget at Qwen3's vocabulary). An fp32 accumulator would cost ``V x H x 4``
bytes (1.5 GiB at Qwen3-4B's lm head), so this script measures the error instead, on CPU:

- ``api``: ``grad_W`` of ``mopd_kernels.linear_logprobs`` and of ``fused_linear_policy_loss``
  (torch backend, chunked, bf16 inputs) -- what ships;
- ``bf16 acc``: the same per-chunk products, recomputed here and summed in bf16 as the chunk loop
  does (should equal ``api``: checks that the script sees the products the library sums);
- ``fp32 acc -> bf16``: the same per-chunk products summed in fp32, rounded to bf16 once at the end
  (what an fp32 accumulator would return); ``fp32 acc``: before that rounding;
- ``fp64 -> bf16``: the fp64 reference rounded to bf16 (the floor for any bf16 result);

each against an fp64 reference (the same loss of the same bf16-valued inputs, computed in fp64 from
the logits on, chunk by chunk with plain autograd: ``mopd_kernels.reference`` in fp64). Errors are
max-abs and relative Frobenius ``||X - R|| / ||R||``.

Shape: T=16,384 rows (the issue's), with the chunk rows the CUDA default sizing gives bf16 at
V=151,936 (1,640 rows: 10 chunks), but H=256 and V=32,768 so that it fits in memory and runs in a
few minutes on 2 cores (the number of roundings is what matters; H and V set only the size of the
matrix). The row pass is the eager torch one (``MOPD_KERNELS_COMPILE=0``, so that ``api`` and
``bf16 acc`` use bit-identical dlogits; ``--compiled`` keeps the compiled CPU pass).

    .venv/bin/python bench/grad_weight_precision.py [--T 16384 --H 256 --V 32768] [--out f.json]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import sys
import time

import torch

QWEN3_V = 151_936
CUDA_SIZING_H = 2560  # Qwen3-4B's hidden size (the CUDA budget sizing does not depend on it)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--T", type=int, default=16384)
    p.add_argument("--H", type=int, default=256)
    p.add_argument("--V", type=int, default=32768)
    p.add_argument("--chunk-rows", type=int, default=None,
                   help="rows per chunk (default: the CUDA default sizing of bf16 at V=151,936)")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--compiled", action="store_true", help="keep the compiled CPU row pass in the api runs")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    return p.parse_args(argv)


ARGS = parse_args()
if not ARGS.compiled:
    os.environ["MOPD_KERNELS_COMPILE"] = "0"

from mopd_kernels import (  # noqa: E402
    LossInputs,
    PolicyLossSettings,
    RoleSpec,
    fused_linear_policy_loss,
    linear_logprobs,
    reference_linear_logprobs,
)
from mopd_kernels import chunked, reference  # noqa: E402


def errors(x: torch.Tensor, ref: torch.Tensor) -> dict:
    d = x.double() - ref
    return {"max_abs": float(d.abs().max()), "rel_fro": float(d.norm() / ref.norm())}


def chunks(T, C):
    return [(s, min(T, s + C)) for s in range(0, T, C)]


def accumulate(hidden, dl_of_chunk, V, C, alpha):
    """Per-chunk products ``alpha dl_c^T h_c`` summed in bf16 (``addmm_``, as the chunk loop) and in fp32."""
    T, H = hidden.shape
    acc16 = torch.zeros(V, H, dtype=hidden.dtype)
    acc32 = torch.zeros(V, H, dtype=torch.float32)
    for s, e in chunks(T, C):
        h_c = hidden[s:e]
        dl = dl_of_chunk(s, e, h_c)
        acc16.addmm_(dl.t(), h_c, alpha=alpha)
        acc32.add_(torch.mm(dl.t().float(), h_c.float()), alpha=alpha)
    return acc16, acc32


def reference_grad(hidden, weight, loss_of_chunk, T, C):
    """fp64 grad_W of the summed chunk losses (token-local losses: the chunks' sums add up)."""
    w64 = weight.double().requires_grad_(True)
    for s, e in chunks(T, C):
        loss_of_chunk(s, e, hidden[s:e].double(), w64).backward()
    return w64.grad


@contextlib.contextmanager
def logits_given():
    """``mopd_kernels.reference`` with ``hidden`` taken as the logits themselves (``weight`` unused)."""
    saved = reference.reference_logits
    reference.reference_logits = lambda hidden, weight, temperature, *_: hidden / temperature
    try:
        yield
    finally:
        reference.reference_logits = saved


def reference_grad_bf16_logits(hidden, weight, loss_of_chunk, T, C):
    """fp64 grad_W of the same losses of the bf16-rounded logits (the function the bf16 path
    computes: its logits matmul writes bf16): every later step exact, so the error against it is
    the gradient path's own (bf16 dlogits, bf16 products, the bf16 running sum)."""
    grad = torch.zeros(weight.shape, dtype=torch.float64)
    with logits_given():
        for s, e in chunks(T, C):
            z = torch.mm(hidden[s:e], weight.t()).double().requires_grad_(True)
            loss_of_chunk(s, e, z, None).backward()
            grad.addmm_(z.grad.t(), hidden[s:e].double())
    return grad


def main():
    args = ARGS
    T, H, V, temp = args.T, args.H, args.V, args.temperature
    dtype = torch.bfloat16
    C = args.chunk_rows or chunked.chunk_rows_for(T, QWEN3_V, 2, torch.device("cuda"), H=CUDA_SIZING_H,
                                                  element_size=2)
    n_chunks = len(chunks(T, C))
    inv_t = 1.0 / temp
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(T, H, generator=g).to(dtype)
    weight = (torch.randn(V, H, generator=g) / H ** 0.5 * 4).to(dtype)  # logits ~ N(0, 16): a peaked softmax
    targets = torch.randint(0, V, (T,), generator=g)
    info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()} {os.cpu_count()} cpus", "torch": torch.__version__,
            "T": T, "H": H, "V": V, "dtype": "bf16", "chunk_rows": C, "chunks": n_chunks, "temperature": temp,
            "row_pass": "compiled" if args.compiled else "eager torch"}
    print(json.dumps(info), flush=True)
    results = {}

    # --- linear_logprobs: d/dW of sum(a logp + b H) ---
    t0 = time.time()
    a = torch.randn(T, generator=g) / T
    b = torch.randn(T, generator=g) / T
    w = weight.clone().requires_grad_(True)
    lp, ent = linear_logprobs(hidden, w, targets, temperature=temp, backend="torch", chunk_rows=C)
    ((a * lp).sum() + (b * ent).sum()).backward()
    api = w.grad
    loop = chunked.ChunkLoop(chunked.TorchRowPass(), temp, C)
    with torch.no_grad():
        _, ent_s, lse_s = chunked.logprobs_forward(hidden, weight, targets, loop)
    row_pass = chunked.TorchRowPass()

    def dl_logprobs(s, e, h_c):
        z = torch.mm(h_c, weight.t())
        return row_pass.logprobs_grad(z, targets[s:e], inv_t, lse_s[s:e], ent_s[s:e], a[s:e], b[s:e])

    acc16, acc32 = accumulate(hidden, dl_logprobs, V, C, inv_t)

    def loss_logprobs(s, e, h64, w64):
        lp64, ent64 = reference_linear_logprobs(h64, w64, targets[s:e], temperature=temp)
        return (a[s:e].double() * lp64).sum() + (b[s:e].double() * ent64).sum()

    ref = reference_grad(hidden, weight, loss_logprobs, T, C)
    ref_z = reference_grad_bf16_logits(hidden, weight, loss_logprobs, T, C)
    results["linear_logprobs"] = table(api, acc16, acc32, ref, ref_z)
    results["linear_logprobs"]["seconds"] = round(time.time() - t0, 1)
    show("linear_logprobs (d/dW of sum a*logp + b*H)", results["linear_logprobs"])

    # --- the fused loss: PPO clip, entropy bonus, token mean ---
    t0 = time.time()
    with torch.no_grad():
        lp_now, _ = linear_logprobs(hidden, weight, targets, temperature=temp, backend="torch", chunk_rows=C,
                                    with_entropy=False)
    old = lp_now + 0.2 * torch.randn(T, generator=g)
    inputs = LossInputs(roles=torch.zeros(T, dtype=torch.long), old_logp=old,
                        advantages=torch.randn(T, generator=g))
    settings = PolicyLossSettings(role_specs=(RoleSpec("outcome", entropy_coef=1e-3),), clip_low=0.2,
                                  clip_high=0.28, temperature=temp, backend="torch", chunk_rows=C)
    w = weight.clone().requires_grad_(True)
    loss, _ = fused_linear_policy_loss(hidden, w, targets, inputs, settings)
    loss.backward()
    api = w.grad
    kin = inputs.for_kernels()
    logp_c = torch.empty(T)
    ent_c = torch.empty(T)

    def dl_loss(s, e, h_c):
        z = torch.mm(h_c, weight.t())
        return row_pass.policy_loss(z, targets[s:e], kin.rows(s, e), settings, logp_c[s:e], ent_c[s:e], True)

    acc16, acc32 = accumulate(hidden, dl_loss, V, C, inv_t / T)

    def loss_fused(s, e, h64, w64):
        inp = LossInputs(roles=inputs.roles[s:e], old_logp=old[s:e].double(),
                         advantages=inputs.advantages[s:e].double())
        return reference.reference_policy_loss(h64, w64, targets[s:e], inp, settings, normalizer=T)[0]

    ref = reference_grad(hidden, weight, loss_fused, T, C)
    ref_z = reference_grad_bf16_logits(hidden, weight, loss_fused, T, C)
    results["fused_loss"] = table(api, acc16, acc32, ref, ref_z)
    results["fused_loss"]["seconds"] = round(time.time() - t0, 1)
    show("fused_linear_policy_loss (PPO clip 0.2/0.28, entropy 1e-3, token mean)", results["fused_loss"])

    if args.out:
        with open(args.out, "w") as f:
            json.dump({"info": info, "results": results}, f, indent=2)
    ok = all(r["api_equals_bf16_acc"] for r in results.values())
    print(f"{'PASS' if ok else 'WARN'}: the script's bf16 accumulation "
          f"{'reproduces' if ok else 'differs from'} the library's grad_W", flush=True)
    return 0


def table(api, acc16, acc32, ref, ref_z):
    variants = {"api (bf16 acc)": api, "bf16 acc (script)": acc16, "fp32 acc -> bf16": acc32.to(torch.bfloat16),
                "fp32 acc": acc32}
    return {
        "ref_max_abs": float(ref.abs().max()), "ref_fro": float(ref.norm()),
        "api_equals_bf16_acc": bool(torch.equal(api, acc16)),
        "vs_fp64": {**{k: errors(v, ref) for k, v in variants.items()},
                    "fp64 -> bf16 (floor)": errors(ref.to(torch.bfloat16), ref)},
        "vs_fp64_of_bf16_logits": {**{k: errors(v, ref_z) for k, v in variants.items()},
                                   "fp64 -> bf16 (floor)": errors(ref_z.to(torch.bfloat16), ref_z)},
        "api_vs_fp32_acc_bf16": errors(api, acc32.to(torch.bfloat16).double()),
    }


def show(title, r):
    print(f"\n{title}: |ref| max {r['ref_max_abs']:.3e}, Frobenius {r['ref_fro']:.3e}; "
          f"api == script bf16 acc: {r['api_equals_bf16_acc']}; {r['seconds']} s")
    print(f"  {'variant':24s} {'vs fp64: max-abs':>17s} {'rel Frobenius':>14s}   "
          f"{'vs fp64 of bf16 logits: max-abs':>31s} {'rel Frobenius':>14s}")
    for k, v in r["vs_fp64"].items():
        w = r["vs_fp64_of_bf16_logits"][k]
        print(f"  {k:24s} {v['max_abs']:17.3e} {v['rel_fro']:14.3e}   {w['max_abs']:31.3e} {w['rel_fro']:14.3e}")
    d = r["api_vs_fp32_acc_bf16"]
    print(f"  api vs fp32 acc -> bf16: max-abs {d['max_abs']:.3e}, rel Frobenius {d['rel_fro']:.3e}")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
