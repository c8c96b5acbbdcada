"""The CPU packed-attention kernel alone: the padded round trip against paths without it.

A packed row of L tokens holds calls of 60-1,500 tokens (as bench_packed_attention.py draws them);
its attention is block-diagonal causal. For q [L, Hq, D], k/v [L, Hkv, D] (SmolLM2-135M: 9 / 3
heads of 64, L = 2,048; the tiny model: 4 / 4 heads of 32, L = 8,192), forward + backward of:

- ``padded``: ``padded_causal_attention`` (``new_zeros`` + an advanced-index scatter of q, k and v
  into a right-padded [S, W, H, D] batch, one causal SDPA, an advanced-index gather).
- ``padded_narrow``: the same batch filled with one slice copy per call, zeroing only the padding.
- ``segments``: one causal SDPA per call over ``split`` views of the packed tensors, as 4-D
  [1, H, n, D], outputs concatenated (``segment_attention``).
- ``segments_3d``: the same with a slice per call given to SDPA as 3-D [H, n, D], as it was before
  2026-12-07 (CPU SDPA runs 3-D input on its math kernel).
- ``blockdiag``: one SDPA over the whole row with a block-diagonal causal boolean mask [L, L].
- ``current``: ``mopd.train.packed_attention.packed_causal_attention`` (whichever path it takes).

Variants alternate round by round in one process (order rotating); medians; ratios against
``padded``. Every variant's output and gradients are checked against ``segments`` first.
``--clock cpu`` times this process's CPU time instead of wall time (fair at one thread on a loaded
machine; at two it counts spinning threads too).

    .venv/bin/python bench/bench_packed_attention_copy.py [--rounds 5] [--threads 1,2] [--shapes smollm2,tiny]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
CLOCK = time.perf_counter
"""The timer: wall time, or with ``--clock cpu`` this process's CPU time (user + system, all its
threads), which a loaded machine inflates less than wall time (a fair measure at one thread)."""
sys.path.insert(0, str(ROOT))

from mopd.train import packed_attention as pa  # noqa: E402

SHAPES = {"smollm2": (2048, 9, 3, 64), "tiny": (8192, 4, 4, 32),   # each model at its micro-batch budget
          "smollm2_8k": (8192, 9, 3, 64), "tiny_2k": (2048, 4, 4, 32)}       # and at the other's


def draw_lengths(total: int, seed: int):
    rng = random.Random(seed)
    lengths = []
    while sum(lengths) < total:
        lengths.append(min(rng.randint(60, 1500), total - sum(lengths)))
    return lengths


def padded_index(q, k, v, layout, scale):
    """The padded round trip as it was before the narrow copies."""
    n_calls, width = len(layout.lengths), layout.max_len

    def pad(t):
        out = t.new_zeros(n_calls, width, t.shape[1], t.shape[2])
        out[layout.rows, layout.cols] = t
        return out.transpose(1, 2)

    o = F.scaled_dot_product_attention(pad(q), pad(k), pad(v), is_causal=True, scale=scale,
                                       enable_gqa=q.shape[1] != k.shape[1])
    return o.transpose(1, 2)[layout.rows, layout.cols]


def padded_narrow(q, k, v, layout, scale):
    """The padded batch filled by one slice copy per call (``pad_sequence``: zeros only in the
    padding) and read back by slices, instead of advanced indexing."""
    lengths = list(layout.lengths)

    def pad(t):
        return torch.nn.utils.rnn.pad_sequence(t.split(lengths), batch_first=True).transpose(1, 2)

    o = F.scaled_dot_product_attention(pad(q), pad(k), pad(v), is_causal=True, scale=scale,
                                       enable_gqa=q.shape[1] != k.shape[1]).transpose(1, 2)
    return torch.cat([o[s, :n] for s, n in enumerate(lengths)])


def segments_3d(q, k, v, layout, scale):
    """The per-call path as it was until 2026-12-07: a slice per call, given to SDPA as 3-D
    [H, n, D] (which CPU SDPA runs on its math kernel), outputs concatenated."""
    gqa = q.shape[1] != k.shape[1]
    outs, start = [], 0
    for n in layout.lengths:
        sl = slice(start, start + n)
        outs.append(F.scaled_dot_product_attention(q[sl].transpose(0, 1), k[sl].transpose(0, 1),
                                                   v[sl].transpose(0, 1), is_causal=True, scale=scale,
                                                   enable_gqa=gqa).transpose(0, 1))
        start += n
    return torch.cat(outs, 0)


def blockdiag(q, k, v, layout, scale):
    seq = layout.rows
    pos = torch.arange(q.shape[0])
    mask = (seq[:, None] == seq[None, :]) & (pos[:, None] >= pos[None, :])
    o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask,
                                       scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return o.transpose(0, 1)


VARIANTS = {
    "padded": padded_index,
    "padded_narrow": padded_narrow,
    "segments": lambda q, k, v, lay, s: pa.segment_attention(q, k, v, lay.lengths, s),
    "segments_3d": segments_3d,
    "blockdiag": blockdiag,
    "current": lambda q, k, v, lay, s: pa.packed_causal_attention(q, k, v, lay, s),
}


def make(shape, seed):
    L, hq, hkv, d = shape
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(L, hq, d, generator=g)
    k = torch.randn(L, hkv, d, generator=g)
    v = torch.randn(L, hkv, d, generator=g)
    grad = torch.randn(L, hq, d, generator=g)
    lengths = draw_lengths(L, seed)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    return q, k, v, grad, pa.packed_layout(cu, torch.device("cpu"))


def fwd_bwd(fn, q, k, v, grad, layout):
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v, layout, None)
    out.backward(grad)
    return out.detach(), q.grad, k.grad, v.grad


def bench_shape(name, shape, threads, rounds, variants) -> dict:
    torch.set_num_threads(threads)
    q, k, v, grad, layout = make(shape, seed=len(name))
    ref = fwd_bwd(VARIANTS["segments"], q, k, v, grad, layout)
    for var in variants:   # correctness first (and the warm-up)
        got = fwd_bwd(VARIANTS[var], q, k, v, grad, layout)
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    times = {var: [] for var in variants}
    for r in range(rounds):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for var in order:
            t = CLOCK()
            fwd_bwd(VARIANTS[var], q, k, v, grad, layout)
            times[var].append(CLOCK() - t)
    base = statistics.median(times["padded"])
    res = {"shape": name, "tokens": shape[0], "calls": len(layout.lengths), "longest": layout.max_len,
           "threads": threads, "load_average": [round(x, 2) for x in os.getloadavg()], "variants": {}}
    for var in variants:
        med = statistics.median(times[var])
        res["variants"][var] = {"median_s": round(med, 4), "vs_padded": round(med / base, 3),
                                "min_s": round(min(times[var]), 4),
                                "min_vs_padded": round(min(times[var]) / min(times["padded"]), 3),
                                "times_s": [round(t, 4) for t in times[var]]}
    print(json.dumps(res), flush=True)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--shapes", default="smollm2,tiny")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    args = ap.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    variants = args.variants.split(",")
    if "padded" not in variants:
        variants.insert(0, "padded")
    results = [bench_shape(s, SHAPES[s], int(t), args.rounds, variants)
               for s in args.shapes.split(",") for t in args.threads.split(",")]
    print("| shape | threads | " + " | ".join(variants) + " |")
    print("|---|---|" + "---|" * len(variants))
    for r in results:
        cells = [f"{r['variants'][v]['median_s']} s ({r['variants'][v]['vs_padded']}x)" for v in variants]
        print(f"| {r['shape']} ({r['tokens']} tokens, {r['calls']} calls) | {r['threads']} | " + " | ".join(cells) + " |")
    meta = {"clock": args.clock, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M"),
            "load_average": [round(x, 2) for x in os.getloadavg()]}
    print(json.dumps(meta))
    if args.out:
        Path(args.out).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
