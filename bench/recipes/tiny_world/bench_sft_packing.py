"""pi_0's SFT step, packed against right-padded, on the demo's own batches.

One process builds (or reuses) a tiny world and pi_0's initial model and demonstrations as the warm
start does (``--questions`` training questions per workflow, both workflows), then trains one copy
of the same initial model per variant on the same batches of 16 episodes, alternating the variants
step by step (the order reversed every other step), and prints each variant's median CPU and wall
seconds per step after the first, and its first losses (equal up to float rounding: the same loss):

- ``padded``: ``SFTSettings(packed=False)``, right-padded rows of one role, its prefix's KV cache
  shared (the warm start before packing);
- ``packed``: one row per role, the prefix once and no padding (``mopd.data.sft.sft_loss_sum_packed``).

CPU seconds are the process's own: on a machine shared with other jobs they move less than wall
seconds, but both rise with the load (note ``os.getloadavg`` beside them).

    .venv/bin/python bench/recipes/tiny_world/bench_sft_packing.py --world /tmp/sft_bench --steps 10
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", required=True, help="directory for the world, the initial model and nothing else")
    ap.add_argument("--questions", type=int, default=300, help="training questions demonstrated (default 300)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--budget", type=int, default=4096, help="micro_batch_tokens of both variants")
    args = ap.parse_args()

    import torch
    from pathlib import Path
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mopd.data import sft
    from mopd.recipes.tiny_world import warmstart as W
    from mopd.recipes.tiny_world.scripted_policy import DemoStyle
    from mopd.recipes.tiny_world.tiny_model import init_tiny_model
    from mopd.recipes.tiny_world.world import build_world

    torch.set_num_threads(args.threads)
    root = Path(args.world)
    paths = build_world(root / "world")
    s = W.WarmStartSettings(max_questions=args.questions)
    init = root / "init"
    if not (init / "config.json").is_file():
        init_tiny_model(init, corpus_texts=W.tokenizer_texts(paths.root), vocab_size=s.vocab_size, hidden=s.hidden,
                        layers=s.layers, heads=s.heads, ffn=s.ffn, seed=s.seed)
    tok = AutoTokenizer.from_pretrained(init)
    from mopd.config import RetrieverConfig
    from mopd.retriever import load_retriever

    retriever = W.CachedRetriever(load_retriever(RetrieverConfig(kind="inprocess", index=str(paths.index))))
    style = DemoStyle(good_query=s.good_query, right_copy=s.right_copy, right_pick=s.right_pick,
                      search_first=s.search_first, split_pair=s.split_pair, both_facts=s.both_facts)
    episodes = W.world_demonstrations(paths.root, init, tok, retriever, s, style).episodes
    weights = torch.ones(len(tok))
    weights[W.name_token_ids(tok)] = s.name_weight
    rng = random.Random(1)
    batches = [[q for e in rng.sample(range(len(episodes)), s.episodes_per_step) for q in episodes[e]]
               for _ in range(args.steps + 1)]
    model = AutoModelForCausalLM.from_pretrained(init, dtype=torch.float32, attn_implementation="sdpa")
    sft._register_packed()
    runs = {}
    for name in ("padded", "packed"):
        m = copy.deepcopy(model).train()
        if name == "packed":
            m.set_attn_implementation(sft.PACKED)
        runs[name] = (m, torch.optim.AdamW(m.parameters(), lr=s.lr, betas=(0.9, 0.95), fused=True), [], [])
    for i, seqs in enumerate(batches):
        targets = [t for ids, m in seqs for t, k in zip(ids[1:], m[1:]) if k]
        n_tokens = float(weights[torch.tensor(targets)].sum(dtype=torch.float64))
        for name in (("padded", "packed") if i % 2 == 0 else ("packed", "padded")):
            m, opt, times, losses = runs[name]
            c0, t0 = time.process_time(), time.perf_counter()
            total = 0.0
            groups = sft.packed_micro_batches if name == "packed" else sft.micro_batches
            for mb in groups(seqs, args.budget):
                part = [seqs[j] for j in mb]
                loss, _ = (sft.sft_loss_sum_packed(m, part, weights) if name == "packed"
                           else sft.sft_loss_sum(m, part, tok.pad_token_id, token_weights=weights))
                (loss / n_tokens).backward()
                total += float(loss.detach())
            torch.nn.utils.clip_grad_norm_(m.parameters(), s.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if i:
                times.append((time.process_time() - c0, time.perf_counter() - t0))
            losses.append(total / n_tokens)
    base = statistics.median(c for c, _ in runs["padded"][2])
    for name, (_, _, times, losses) in runs.items():
        cpu, wall = statistics.median(c for c, _ in times), statistics.median(w for _, w in times)
        print(f"{name:7s} cpu/step {cpu:.3f} s ({cpu / base:.2f}x padded)  wall/step {wall:.3f} s  "
              f"losses {' '.join(f'{x:.4f}' for x in losses[:3])} ... {losses[-1]:.4f}")
    print(f"{len(episodes)} episodes; {args.threads} thread(s); load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
