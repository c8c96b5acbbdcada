"""One real training step of a small Qwen3-architecture model on the GPU (HF engine), timed by phase.

Run by ``bench/gpu_check.sh`` after the kernel checks (``--dry-run``: CPU, tiny sizes, for CI).
It builds a random Qwen3 model (hidden 1024, 8 layers by default) with the project's tiny
tokenizer, runs a Stage I (cmas_rl) step on a few invented questions against an in-memory
retriever, and prints one JSON line with the time and tokens per second of rollout, scoring and
training, and the peak GPU memory. Correctness is the trainer tests' job; this records speed.
``--lora-rank R``: the same step with LoRA adapters of rank R (``model.lora.rank``; needs peft), for
the step time and peak memory beside full fine-tuning's.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class MemoryRetriever:
    def search(self, queries, k):
        from mopd.retriever import Passage

        return [[Passage(id=f"{j}", title=f"Doc {j}", text=f"{q} is described in document {j}.", score=1.0)
                 for j in range(k)] for q in queries]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes (CI self-check)")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--questions", type=int, default=16)
    p.add_argument("--lora-rank", type=int, default=0,
                   help="train LoRA adapters of this rank (model.lora.rank, alpha 2 x rank) instead of all weights")
    p.add_argument("--out", default=None, help="write the JSON result here")
    a = p.parse_args(argv)
    name = "train_step_lora" if a.lora_rank > 0 else "train_step"
    lora = []
    if a.lora_rank > 0:
        import importlib.util

        if importlib.util.find_spec("peft") is None:
            print(f"SKIP {name}: peft is not installed (carry .whl: bash bench/fetch_gpu_wheels.sh)", flush=True)
            return 0
        # LoRA takes a larger learning rate than full fine-tuning (docs/gpu_training.md)
        lora = [f"model.lora.rank={a.lora_rank}", f"model.lora.alpha={2 * a.lora_rank}", "trainer.lr=1e-5"]
    rollout = ["rollout.max_output_tokens=128", "rollout.group_size=5", "rollout.answer_candidates=5"]
    if a.dry_run:
        a.hidden, a.layers, a.questions = 64, 1, 2
        rollout = ["rollout.max_output_tokens=8", "rollout.group_size=2", "rollout.answer_candidates=2",
                   "rollout.max_steps=2"]

    import torch

    if not a.dry_run and not torch.cuda.is_available():
        print(f"FAIL {name}: no CUDA device (use --dry-run for the CPU self-check)", flush=True)
        return 1
    from mopd.config import resolve
    from tests.helpers.tiny_model import init_tiny_model
    from mopd.train.trainer import PolicyTrainer

    tmp = Path(tempfile.mkdtemp(prefix="mopd_gpu_step_"))
    model_dir = init_tiny_model(tmp / "model", vocab_size=1024, hidden=a.hidden, layers=a.layers,
                                heads=max(1, a.hidden // 128), ffn=3 * a.hidden, seed=0)
    qa = tmp / "qa.jsonl"
    qa.write_text("".join(json.dumps({"id": f"q{i}", "question": f"Where was the band number {i} formed?",
                                      "golden_answers": [f"town {i}"]}) + "\n" for i in range(a.questions)))
    cfg = resolve("cmas_rl", [f"model.path={model_dir}", f"data.train={qa}", f"trainer.out_dir={tmp / 'run'}",
                              f"trainer.questions_per_step={a.questions}", "trainer.val_every=0",
                              "trainer.checkpoint_every=0", *rollout, *lora])
    t0 = time.perf_counter()
    trainer = PolicyTrainer(cfg, retriever=MemoryRetriever(), progress=False)
    setup_s = time.perf_counter() - t0
    m = trainer.train_step()
    m = trainer.train_step()        # the second step is the one reported (compilation/warm-up done)
    res = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
           "hidden": a.hidden, "layers": a.layers, "params_m": sum(x.numel() for x in trainer.model.parameters()) / 1e6,
           "setup_s": round(setup_s, 2), "lora_rank": a.lora_rank,
           "trainable_params_m": sum(x.numel() for x in trainer.model.parameters() if x.requires_grad) / 1e6}
    if torch.cuda.is_available():
        res["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2 ** 30, 3)
    res.update({k: round(v, 4) for k, v in m.items() if k.startswith("perf/") or k in ("loss/total",)})
    print(("TRAIN_STEP_LORA " if a.lora_rank > 0 else "TRAIN_STEP ") + json.dumps(res), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=2))
    ok = all(v == v for v in res.values() if isinstance(v, float))
    if a.lora_rank > 0:   # only the adapters train: the base is frozen, the lm head is never adapted
        frozen_ok = all(".lora_" in n for n, x in trainer.model.named_parameters() if x.requires_grad)
        ok = ok and frozen_ok and res["trainable_params_m"] > 0
    print(f"PASS {name}" if ok else f"FAIL {name}: non-finite metric or a trainable base weight")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
