"""Packed attention on CPU: a Stage II-like update and a no-grad scoring pass of packed
micro-batches, padded SDPA batch against the packed paths (mopd.train.packed_attention).

    .venv/bin/python bench/bench_packed_attention.py [--rounds 3] [--models tiny,smollm2] [--out FILE]

Micro-batches hold agent calls of 60-1,500 tokens (uniform, seeded), filled first-fit up to a
token budget (8,192 for the tiny model, 2,048 for SmolLM2-135M, whose update costs ~13 TFLOP at
8k). The update is the trainer's: forward of the packed model, the fused policy-loss head
(``PackedCausalLM`` with ``FusedLinearPolicyLoss``, OPD advantages on the Searcher's role),
backward. Scoring is the pi_old / teacher pass (``PackedCausalLM`` without a loss, no grad).
Variants alternate round by round in one process; each cell is the median over rounds, and the
ratios are against the padded batch (``sdpa``). Peak memory is the extra tensor memory of one
more run under ``mopd_kernels.memtrack.TensorMemoryTracker`` (untimed).

``flex`` runs only in scoring: FlexAttention has no CPU backward (its CPU update is
``packed_sdpa``'s). Its one compile (about 10 s) happens in an untimed warm-up.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mopd_kernels import FusedLinearPolicyLoss, PolicyLossSettings, RoleSpec  # noqa: E402
from mopd_kernels.memtrack import TensorMemoryTracker  # noqa: E402
from mopd.train import packed_attention as pa  # noqa: E402
from mopd.train.model import PackedCausalLM  # noqa: E402
from mopd.train.packing import build_packed_batch, pack_sequences  # noqa: E402

SPECS = [RoleSpec(entropy_coef=1e-3), RoleSpec(advantage="opd"), RoleSpec(entropy_coef=1e-3)]
IMPLS = {"padded": "sdpa", "packed_sdpa": pa.SEGMENTS, "flex": pa.FLEX}


def draw_calls(vocab: int, total: int, seed: int):
    """Agent calls of 60-1,500 tokens adding up to about ``total``: the first half of each is
    prompt (role -1), the rest one role's output with an advantage and sampling log-probs."""
    rng = random.Random(seed)
    calls, n_tokens = [], 0
    while n_tokens < total:
        n = rng.randint(60, 1500)
        roles = [-1] * (n // 2) + [rng.choice([0, 1, 2])] * (n - n // 2)
        calls.append(([rng.randrange(vocab) for _ in range(n)], roles, [rng.uniform(-1, 1)] * n,
                      [-rng.uniform(0.5, 3)] * n))
        n_tokens += n
    return calls


def micro_batches(calls, budget: int):
    batches = []
    for members in pack_sequences([len(c[0]) for c in calls], budget):
        b = build_packed_batch(*zip(*[calls[i] for i in members]))
        b.old_logp, b.teacher_logp = b.sampling_logp, b.sampling_logp - 0.1
        batches.append(b)
    return batches


def padding_fraction(batches) -> float:
    """Share of the padded [calls, longest] layout that is padding, over all micro-batches."""
    padded = real = 0
    for b in batches:
        lengths = (b.cu_seqlens[1:] - b.cu_seqlens[:-1]).tolist()
        padded += len(lengths) * max(lengths)
        real += sum(lengths)
    return 1 - real / padded


def update(model, batches) -> None:
    policy = PackedCausalLM(model)
    loss_fn = FusedLinearPolicyLoss(PolicyLossSettings(role_specs=SPECS))
    n = float(sum(b.loss_tokens for b in batches))
    for b in batches:
        loss, _ = policy(b, loss_fn, normalizer=n)
        loss.backward()
    model.zero_grad(set_to_none=True)


def score(model, batches) -> None:
    policy = PackedCausalLM(model)
    with torch.no_grad():
        for b in batches:
            policy(b)


def timed(fn, model, batches) -> float:
    t = time.perf_counter()
    fn(model, batches)
    return time.perf_counter() - t


def peak_mib(fn, model, batches) -> float:
    with TensorMemoryTracker() as mem:
        fn(model, batches)
    return mem.peak_bytes / 2**20


def tiny_model():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from tests.helpers.tiny_model import TinyModelSpec

    s = TinyModelSpec()
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=s.vocab_size + 32, hidden_size=s.hidden, intermediate_size=s.ffn,
                      num_hidden_layers=s.layers, num_attention_heads=s.heads, num_key_value_heads=s.heads,
                      head_dim=s.hidden // s.heads, max_position_embeddings=2048, tie_word_embeddings=True)
    return Qwen3ForCausalLM(cfg), "tiny Qwen3 (hidden 128, 2 layers, 4 heads; random)"


def smollm2():
    """SmolLM2-135M-Instruct from ``make real-model``'s cache, else a random model of its shape."""
    cache = Path(os.environ.get("MOPD_REAL_MODELS") or ROOT / ".cache" / "real-models")
    found = sorted(p.parent for p in cache.glob("**/config.json")) if cache.exists() else []
    found = [p for p in found if "smollm2" in str(p).lower()] or found
    if found:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(found[0], dtype=torch.float32), f"SmolLM2-135M ({found[0]})"
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                      tie_word_embeddings=True)
    return LlamaForCausalLM(cfg), "SmolLM2-135M-sized Llama (random weights: no real-model cache)"


def set_impl(model, impl: str) -> None:
    pa.register()
    model.set_attn_implementation(impl)


def bench_model(model, label: str, budget: int, tokens: int, rounds: int, seed: int) -> dict:
    model.config.use_cache = False
    batches = micro_batches(draw_calls(model.config.vocab_size - 32, tokens, seed), budget)
    res = {"model": label, "budget": budget, "micro_batches": len(batches),
           "tokens": sum(b.num_tokens for b in batches),
           "calls": sum(len(b.cu_seqlens) - 1 for b in batches),
           "padding_fraction": round(padding_fraction(batches), 3), "update": {}, "scoring": {}}
    plans = {"update": (update, ["padded", "packed_sdpa"]), "scoring": (score, ["padded", "packed_sdpa", "flex"])}
    for phase, (fn, variants) in plans.items():
        times = {v: [] for v in variants}
        for v in variants:              # warm-up, untimed: flex's compile, first-touch allocations
            set_impl(model, IMPLS[v])
            fn(model, batches[:1])
        for r in range(rounds):
            for v in (variants if r % 2 == 0 else variants[::-1]):
                set_impl(model, IMPLS[v])
                times[v].append(timed(fn, model, batches))
        base = statistics.median(times["padded"])
        for v in variants:
            set_impl(model, IMPLS[v])
            try:
                mem = round(peak_mib(fn, model, batches), 1)
            except Exception as e:   # noqa: BLE001 (a compiled kernel under a dispatch mode)
                mem = f"not measured ({type(e).__name__})"
            med = statistics.median(times[v])
            res[phase][v] = {"median_s": round(med, 3), "times_s": [round(t, 3) for t in times[v]],
                             "speedup_vs_padded": round(base / med, 2), "peak_extra_mib": mem}
        print(json.dumps({label: {phase: res[phase]}}), flush=True)
    return res


def table(results) -> str:
    lines = ["| model | phase | variant | median s | vs padded | peak extra MiB |", "|---|---|---|---|---|---|"]
    for r in results:
        for phase in ("update", "scoring"):
            for v, c in r[phase].items():
                lines.append(f"| {r['model']} | {phase} | {v} | {c['median_s']} | {c['speedup_vs_padded']}x | "
                             f"{c['peak_extra_mib']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default="tiny,smollm2")
    ap.add_argument("--tiny-tokens", type=int, default=32768, help="tokens drawn for the tiny model (8k micro-batches)")
    ap.add_argument("--smol-tokens", type=int, default=4096, help="tokens drawn for SmolLM2 (2k micro-batches)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    results = []
    for name in args.models.split(","):
        if name == "tiny":
            model, label = tiny_model()
            results.append(bench_model(model, label, 8192, args.tiny_tokens, args.rounds, seed=0))
        elif name == "smollm2":
            model, label = smollm2()
            results.append(bench_model(model, label, 2048, args.smol_tokens, args.rounds, seed=1))
        else:
            ap.error(f"unknown model {name!r}: tiny or smollm2")
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "load_average": os.getloadavg(),
            "date": time.strftime("%Y-%m-%d")}
    print(table(results))
    print(json.dumps(meta))
    if args.out:
        Path(args.out).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
