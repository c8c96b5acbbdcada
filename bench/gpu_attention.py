"""GPU check of the packed attention paths (mopd.train.packed_attention) on one packed micro-batch.

Run by ``bench/gpu_check.sh`` after the kernel checks (``--dry-run``: CPU, tiny sizes, for CI).

1. Attention alone at Qwen3-4B's heads (32 query heads, 8 K/V heads, head dim 128, bf16) over a
   16,384-token row of calls of 60-1,500 tokens: torch's ``varlen_attn`` through our wrapper
   (``run_varlen``: GQA, the causal spelling of the installed torch), flash-attn's
   ``flash_attn_varlen_func`` when installed, the padded [calls, longest] SDPA batch with its
   mask (what ``sdpa`` runs) and without one (causal over right padding: ``packed_sdpa``).
   Outputs and q/k/v gradients are held to an fp32 per-call reference (bf16 tolerance); forward
   plus backward times are medians of CUDA-event runs, given as ratios to varlen_attn.
2. The whole path: a small Qwen3 (GQA) loaded with ``model.attn_implementation=auto`` must get
   varlen_attn when flash-attn is absent, and its packed hidden states must equal each call
   run alone.

``--dry-run`` runs the same code on CPU in fp32 at tiny sizes with the pure-torch
``reference_varlen_attn`` standing in for the CUDA kernel (plumbing only; no real timings).
Torch before 2.10 has no varlen_attn: its rows say SKIP and the check passes on the others.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mopd.train import packed_attention as pa  # noqa: E402

FAILED, LINES = [], []


def report(ok: bool, what: str, detail: str = "") -> bool:
    line = f"{'PASS' if ok else 'FAIL'} {what}" + (f"  ({detail})" if detail else "")
    print(line, flush=True)
    LINES.append(line)
    if not ok:
        FAILED.append(what)
    return ok


def info(line: str) -> None:
    print(f"INFO {line}", flush=True)
    LINES.append(f"INFO {line}")


def draw_lengths(total: int, lo: int, hi: int, seed: int = 0):
    rng = random.Random(seed)
    out = []
    while sum(out) < total:
        out.append(rng.randint(lo, hi))
    return out


def padded_sdpa(q, k, v, layout, masked: bool):
    """The padded batch's attention: with its [S, 1, W, W] mask (``sdpa``'s), or causal alone."""
    if not masked:
        return pa.padded_causal_attention(q, k, v, layout, None)
    n, w = len(layout.lengths), layout.max_len

    def pad(t):
        out = t.new_zeros(n, w, t.shape[1], t.shape[2])
        out[layout.rows, layout.cols] = t
        return out.transpose(1, 2)

    valid = torch.zeros(n, w, dtype=torch.bool, device=q.device)
    valid[layout.rows, layout.cols] = True
    mask = torch.ones(w, w, dtype=torch.bool, device=q.device).tril()[None, None] & valid[:, None, None, :]
    o = F.scaled_dot_product_attention(pad(q), pad(k), pad(v), attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])
    return o.transpose(1, 2)[layout.rows, layout.cols]


def flash_attn_fn():
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None
    return lambda q, k, v, lay: flash_attn_varlen_func(q, k, v, lay.cu_seqlens, lay.cu_seqlens, lay.max_len,
                                                      lay.max_len, causal=True)


def fwd_bwd(fn, q, k, v, grad):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    out.backward(grad)
    return out.detach(), q.grad, k.grad, v.grad


def time_ms(fn, q, k, v, grad, reps: int, cuda: bool) -> float:
    times = []
    for _ in range(reps + 1):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fwd_bwd(fn, q, k, v, grad)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fwd_bwd(fn, q, k, v, grad)
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times[1:])


def attention_check(dry_run: bool, summary: dict) -> None:
    device = torch.device("cpu" if dry_run else "cuda")
    dtype = torch.float32 if dry_run else torch.bfloat16
    hq, hkv, d = (6, 2, 16) if dry_run else (32, 8, 128)
    lengths = draw_lengths(300, 5, 90) if dry_run else draw_lengths(16384, 60, 1500)
    total = sum(lengths)
    cu = torch.tensor([0, *lengths]).cumsum(0)
    layout = pa.packed_layout(cu, device)
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(total, h, d, generator=g).to(device, dtype) for h in (hq, hkv, hkv))
    grad = torch.randn(total, hq, d, generator=g).to(device, dtype)
    info(f"attention: {len(lengths)} calls, {total} tokens (longest {max(lengths)}), heads {hq}/{hkv}, "
         f"head dim {d}, {dtype}; padding of the padded batch {1 - total / (len(lengths) * max(lengths)):.1%}")
    truth = fwd_bwd(lambda a, b, c: pa.segment_attention(a, b, c, lengths, None),
                    *(t.float() for t in (q, k, v)), grad.float())
    variants = {}
    if pa.torch_varlen_attn() is not None and not dry_run:
        variants["varlen_attn"] = lambda a, b, c: pa.run_varlen(a, b, c, layout, None)
    elif dry_run:
        pa._varlen_kernel = pa.reference_varlen_attn
        info("dry run: the pure-torch reference_varlen_attn stands in for torch's CUDA kernel")
        variants["varlen_attn"] = lambda a, b, c: pa.run_varlen(a, b, c, layout, None)
    else:
        info(f"SKIP varlen_attn: torch {torch.__version__} has no torch.nn.attention.varlen (2.10 and later)")
    fa = None if dry_run else flash_attn_fn()
    if fa is not None:
        variants["flash_attn"] = lambda a, b, c: fa(a, b, c, layout)
    else:
        info("flash-attn not installed (or dry run): not compared")
    variants["padded_sdpa_masked"] = lambda a, b, c: padded_sdpa(a, b, c, layout, masked=True)
    variants["padded_sdpa_causal"] = lambda a, b, c: padded_sdpa(a, b, c, layout, masked=False)
    tol = 1e-5 if dry_run else 2e-2   # bf16 carries 8 bits: ~4e-3 relative per rounding
    res = summary.setdefault("attention", {})
    for name, fn in variants.items():
        got = fwd_bwd(fn, q, k, v, grad)
        errs = [float((a.float() - b).abs().max() / b.abs().max()) for a, b in zip(got, truth)]
        ok = report(max(errs) <= tol, f"attention {name} equals the per-call fp32 reference",
                    "max |err| / max |ref| of out, dq, dk, dv " + " ".join(f"{e:.1e}" for e in errs)
                    + f"; tolerance {tol:g}")
        ms = time_ms(fn, q, k, v, grad, reps=2 if dry_run else 10, cuda=not dry_run)
        res[name] = {"ok": ok, "max_rel_err": errs, "fwd_bwd_ms": round(ms, 3)}
    base = res.get("varlen_attn", {}).get("fwd_bwd_ms")
    for name, r in res.items():
        r["ms_vs_varlen"] = round(r["fwd_bwd_ms"] / base, 2) if base else None
        info(f"attention {name}: fwd+bwd {r['fwd_bwd_ms']} ms" + (f" = {r['ms_vs_varlen']}x varlen_attn" if base else ""))


def model_check(dry_run: bool, summary: dict) -> None:
    """auto's choice on this machine, and packed hidden states against each call alone."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from mopd.train.model import choose_attn, packed_hidden
    from mopd.train.packing import build_packed_batch

    device = torch.device("cpu" if dry_run else "cuda")
    impl = pa.VARLEN if dry_run else choose_attn("auto", device)
    has_flash = not dry_run and flash_attn_fn() is not None
    if not dry_run and pa.torch_varlen_attn() is not None:
        report(impl == ("flash_attention_2" if has_flash else pa.VARLEN),
               "model.attn_implementation=auto picks flash-attn when installed, else varlen_attn", impl)
    summary["auto_attn"] = impl
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=211, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096)
    cfg._attn_implementation = "sdpa"
    dtype = torch.float32 if dry_run else torch.bfloat16
    model = Qwen3ForCausalLM(cfg).to(device, dtype).eval()
    lengths = [7, 130, 1, 61] if dry_run else [700, 1, 1499, 333, 64]
    g = torch.Generator().manual_seed(1)
    calls = [torch.randint(0, 211, (n,), generator=g).tolist() for n in lengths]
    zeros = [[0.0] * n for n in lengths]
    batch = build_packed_batch(calls, [[0] * n for n in lengths], zeros, zeros).to(device)
    with torch.no_grad():
        alone = torch.cat([model.model(input_ids=torch.tensor(c, device=device)[None]).last_hidden_state[0]
                           for c in calls]).float()
        pa.register()
        model.set_attn_implementation(impl)
        got = packed_hidden(model, batch).float()
    err = float((got - alone).abs().max() / alone.abs().max())
    tol = 1e-5 if dry_run else 2e-2
    summary["model_rel_err"] = err
    report(err <= tol, f"packed hidden states under {impl} equal each call alone", f"max rel err {err:.2e}, tol {tol:g}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, the reference kernel (CI self-check)")
    p.add_argument("--out", default=None, help="write the JSON summary here")
    args = p.parse_args(argv)
    summary = {"dry_run": args.dry_run, "torch": torch.__version__,
               "varlen_attn": pa.torch_varlen_attn() is not None}
    t0 = time.perf_counter()
    if not args.dry_run and not torch.cuda.is_available():
        report(False, "gpu_attention: no CUDA device (use --dry-run for the CPU self-check)")
    else:
        if not args.dry_run:
            info(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}")
        for check in (attention_check, model_check):
            try:
                check(args.dry_run, summary)
            except Exception as e:  # noqa: BLE001 (one failed check must not hide the others)
                report(False, f"{check.__name__} raised {type(e).__name__}: {str(e)[:300]}")
    summary.update(ok=not FAILED, failed_checks=FAILED, lines=LINES, wall_s=round(time.perf_counter() - t0, 1))
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1))
    print(f"{'PASS' if not FAILED else 'FAIL'} gpu_attention {'dry run ' if args.dry_run else ''}"
          f"({len(FAILED)} failed check(s), {summary['wall_s']} s)", flush=True)
    return 0 if not FAILED else 1


if __name__ == "__main__":
    sys.exit(main())
