"""The HF engine's generation against its floor: the same model stepped by hand into a preallocated
static cache.

For each (batch, prompt length, threads) cell, one process alternates the two variants round by
round (the order flips each round) on the same work and reports medians:

- ``engine``: ``HFEngine.generate`` of ``batch / samples`` requests of ``prompt`` random tokens with
  ``n = samples`` each (the GRPO shape: a request's samples share one prefill), temperature 1,
  ``max_new_tokens`` new tokens, no prefix cache (every round prefills again), EOS never ends a row
  (``eos_ids`` emptied: both variants make exactly ``new`` tokens a row).
- ``floor``: transformers' ``StaticCache`` sized prompt + new; one forward over the unique prompts,
  its cache rows repeated for the samples (``reorder_cache``), then ``new`` single-token forwards
  with no attention mask (no padding: all prompts have the same length), each choosing its token
  by ``argmax`` (the cheapest choice there is: 0.35 ms a step at batch 8 and vocabulary 49,152,
  where ``torch.multinomial`` takes 10.6 ms and the engine's seeded inverse-CDF sampling 5.8 ms)
  into a preallocated token buffer; one host transfer at the end.

The prefill (one forward of the unique prompts) is the same work in both and at 1,536 tokens most of
the time, so each variant computes it once per cell and later runs replay a copy of it (the engine's
``_prefill`` wrapped; ``--prefill`` prefills every run instead). The prefill (or its copy) is timed
apart, and the rows report the whole call and the decode alone: ``ratio`` = engine / floor of the
whole call, ``decode ratio`` = (engine - its prefill) / (floor - its prefill), the loop this bench is
about.

    .venv/bin/python bench/bench_decode_floor.py                      # batch 8 and 32, prompt 256 and 1536, threads 1 and 2
    .venv/bin/python bench/bench_decode_floor.py --batches 8 --prompts 256 --threads 1 --rounds 3
    .venv/bin/python bench/bench_decode_floor.py --model tiny         # the tests' 2-layer model (fast)

The model is SmolLM2-135M-Instruct's shape (Llama, 30 layers, hidden 576, 9 heads / 3 KV heads,
vocabulary 49,152) with random weights, or the real one under ``MOPD_REAL_MODELS``/.cache/real-models
(as bench_packed_attention.py finds it); fp32 on the CPU.
"""

from __future__ import annotations

import argparse
import copy
import inspect
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CLOCK = time.perf_counter
"""The timer: wall time, or with ``--clock cpu`` this process's CPU time (user + system, all its
threads), which a loaded machine inflates less than wall time (a fair measure at one thread)."""
sys.path.insert(0, str(ROOT))

from mopd.core.generation import GenerationRequest, SamplingParams  # noqa: E402
from mopd.rollout.hf_engine import HFEngine  # noqa: E402
from mopd.rollout.random_model import default_corpus, train_tokenizer  # noqa: E402


def smollm2_shaped():
    cache = Path(os.environ.get("MOPD_REAL_MODELS") or ROOT / ".cache" / "real-models")
    found = sorted(p.parent for p in cache.glob("**/config.json")) if cache.exists() else []
    found = [p for p in found if "smollm2" in str(p).lower()]
    if found:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(found[0], dtype=torch.float32), f"SmolLM2-135M ({found[0]})"
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                      tie_word_embeddings=True)
    return LlamaForCausalLM(cfg), "SmolLM2-135M-shaped Llama (random weights)"


def tiny():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=1056, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, head_dim=32, max_position_embeddings=4096,
                      tie_word_embeddings=True)
    return Qwen3ForCausalLM(cfg), "tiny Qwen3 (hidden 128, 2 layers; random)"


def prompts_for(vocab: int, unique: int, length: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (unique, length), generator=g)


REPLAY: dict = {}
"""Prefills already computed, by variant and work, when ``--replay-prefill`` is on (the default)."""
REPLAY_ON = [True]


def replayed(key, compute):
    """``compute()``, or with replay on, a copy of its first result for ``key`` (the copy's time
    counts as the prefill's: the decode loop is what the bench compares)."""
    if not REPLAY_ON[0]:
        return compute()
    if key not in REPLAY:
        REPLAY[key] = compute()
    return copy.deepcopy(REPLAY[key])


def floor_decode(model, prompts: torch.Tensor, samples: int, new: int):
    """(tokens [rows, new], prefill seconds): the hand-stepped static-cache decode."""
    from transformers import StaticCache

    U, P = prompts.shape
    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    t0 = CLOCK()

    def prefill():
        cache = StaticCache(config=model.config, max_cache_len=P + new)
        logits = model(input_ids=prompts, use_cache=True, logits_to_keep=1, **{kw: cache}).logits[:, -1]
        if samples > 1:
            idx = torch.arange(U).repeat_interleave(samples)
            cache.reorder_cache(idx)
            logits = logits[idx]
        return cache, logits

    cache, logits = replayed(("floor", prompts.shape, samples, new), prefill)
    t_prefill = CLOCK() - t0
    out = torch.empty(U * samples, new, dtype=torch.long)
    pos = torch.full((U * samples, 1), P, dtype=torch.long)
    for i in range(new):
        tok = logits.argmax(-1, keepdim=True)
        out[:, i:i + 1] = tok
        if i + 1 == new:
            break
        logits = model(input_ids=tok, position_ids=pos, use_cache=True, logits_to_keep=1,
                       **{kw: cache}).logits[:, -1]
        pos += 1
    return out.tolist(), t_prefill


def engine_run(engine, prompts: torch.Tensor, samples: int, new: int, seed: int):
    reqs = [GenerationRequest(p, SamplingParams(n=samples, temperature=1.0, max_new_tokens=new, seed=seed + i))
            for i, p in enumerate(prompts.tolist())]
    spent = [0.0]
    inner = engine._prefill

    def timed_prefill(prompts, room=0):
        t = CLOCK()
        try:
            return replayed(("engine", tuple(map(tuple, prompts)), room), lambda: inner(prompts, room=room))
        finally:
            spent[0] += CLOCK() - t

    engine._prefill = timed_prefill
    try:
        out = engine.generate(reqs)
    finally:
        del engine._prefill
    assert all(len(c.token_ids) == new for x in out for c in x)
    return out, spent[0]


def cell(model, engine, batch: int, prompt: int, threads: int, args) -> dict:
    samples = min(args.samples, batch)
    unique = batch // samples
    prompts = prompts_for(model.config.vocab_size, unique, prompt, seed=batch * 7919 + prompt)
    engine.cpu_threads = threads
    torch.set_num_threads(threads)
    times = {"engine": [], "floor": []}
    prefill = {"engine": [], "floor": []}

    def run(variant, new=args.new):
        t = CLOCK()
        with torch.inference_mode():
            if variant == "engine":
                _, p = engine_run(engine, prompts, samples, new, seed=1)
            else:
                _, p = floor_decode(model, prompts, samples, new)
        times[variant].append(CLOCK() - t)
        prefill[variant].append(p)

    for v in ("engine", "floor"):   # warm-up, untimed (first-touch allocations; the prefill to replay)
        run(v)
        times[v].clear()
        prefill[v].clear()
    for r in range(args.rounds):
        for v in (("engine", "floor") if r % 2 == 0 else ("floor", "engine")):
            run(v)
    med = {v: statistics.median(times[v]) for v in times}
    dec = {v: statistics.median([t - p for t, p in zip(times[v], prefill[v])]) for v in times}
    res = {"batch": batch, "prompt": prompt, "samples": samples, "threads": threads, "new": args.new,
           "engine_s": round(med["engine"], 3), "floor_s": round(med["floor"], 3),
           "engine_decode_s": round(dec["engine"], 3), "floor_decode_s": round(dec["floor"], 3),
           "ratio": round(med["engine"] / med["floor"], 3),
           "decode_ratio": round(dec["engine"] / dec["floor"], 3),
           "times": {v: [round(t, 3) for t in ts] for v, ts in times.items()},
           "load_average": [round(x, 2) for x in os.getloadavg()]}
    print(json.dumps(res), flush=True)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    ap.add_argument("--batches", default="8,32")
    ap.add_argument("--prompts", default="256,1536")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--samples", type=int, default=4, help="samples per request (rows sharing a prefill)")
    ap.add_argument("--new", type=int, default=48, help="new tokens per row")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    ap.add_argument("--prefill", action="store_true",
                    help="prefill every run (default: each variant's first prefill of a cell is replayed from a copy)")
    args = ap.parse_args(argv)
    REPLAY_ON[0] = not args.prefill
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    model, label = smollm2_shaped() if args.model == "smollm2" else tiny()
    model.eval()
    tokenizer = train_tokenizer(default_corpus())
    engine = HFEngine(model, tokenizer, prefix_cache_mb=0)
    engine.eos_ids = set()   # rows run to their token limit, as the floor's do
    results = []
    for b in (int(x) for x in args.batches.split(",")):
        for p in (int(x) for x in args.prompts.split(",")):
            for t in (int(x) for x in args.threads.split(",")):
                results.append(cell(model, engine, b, p, t, args))
    meta = {"clock": args.clock, "model": label, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M"),
            "load_average": [round(x, 2) for x in os.getloadavg()]}
    print("| batch | prompt | threads | engine s | floor s | ratio | decode: engine s | floor s | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['batch']} | {r['prompt']} | {r['threads']} | {r['engine_s']} | {r['floor_s']} | {r['ratio']}x | "
              f"{r['engine_decode_s']} | {r['floor_decode_s']} | {r['decode_ratio']}x |")
    print(json.dumps(meta))
    if args.out:
        Path(args.out).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
