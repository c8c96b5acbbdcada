"""One tiny seeded run of the demo's stages, in a fresh process: prints a JSON line of digests.

Usage: python determinism_worker.py OUT_DIR. The caller sets the environment (the pinned CPU
variables of mopd.core.reproducible, a PYTHONHASHSEED of its choice) before this process starts,
as the ``mopd`` command does. Stages: the quick world with a BM25 index, a warm start of 3 SFT
steps, one Stage-I step with its validation on dev, and the per-query retrieval of a few
queries through QueryMemo with the bundled MiniLM index encoding.
"""

import hashlib
import json
import sys
from pathlib import Path


def digest_tensors(tensors) -> str:
    h = hashlib.sha256()
    for name, t in sorted(tensors.items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def main(out: Path) -> None:
    from mopd.core.reproducible import deterministic_torch, environment_record

    deterministic_torch(1)
    import torch
    from safetensors.torch import load_file

    from mopd.config import RetrieverConfig, resolve
    from mopd.recipes.tiny_world.world import build_world, parse_world_settings
    from mopd.recipes.tiny_world.warmstart import build_pi0
    from mopd.recipes.tiny_world.pipeline import QUICK_OVERRIDES
    from mopd.retriever import load_retriever
    from mopd.retriever.memo import QueryMemo
    from mopd.rollout.scheduler import run_workflows
    from mopd.train.trainer import PolicyTrainer

    world = build_world(out / "world", settings=parse_world_settings(seed=3, index_kind="bm25", quick=True))
    pi0 = build_pi0(world.root, out / "pi0", seed=3, steps=3, max_questions=4, attempts=1, episodes_per_step=4,
                    hidden=32, layers=1, heads=2, ffn=64, vocab_size=1200, progress=False)
    retriever = QueryMemo(load_retriever(RetrieverConfig(kind="inprocess", index=str(world.index))))
    cfg = resolve("tiny_cmas_rl", QUICK_OVERRIDES + [
        f"model.path={pi0}", f"data.train={world.train}", f"data.dev={world.dev}", "retriever.kind=inprocess",
        f"retriever.index={world.index}", f"trainer.out_dir={out / 'stage1'}", "trainer.steps=1",
        "trainer.seed=3", "rollout.seed=3"])
    trainer = PolicyTrainer(cfg, retriever=retriever, progress=False, rollout_fn=run_workflows)
    try:
        trainer.fit()
        stage1 = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    finally:
        trainer.close()
    metrics = (out / "stage1" / "metrics.jsonl").read_text().splitlines()
    # everything but wall-clock measurements
    def timing(k):
        return k == "time" or k.startswith("perf/") or k.endswith("_s") or "per_s" in k or "busy" in k or "mem" in k

    numeric = [{k: v for k, v in json.loads(line).items() if not timing(k)} for line in metrics]
    print(json.dumps({
        "pi0": digest_tensors(load_file(str(pi0 / "model.safetensors"))),
        "pi0_losses": json.loads((pi0 / "pi0.json").read_text())["losses"],
        "stage1": digest_tensors(stage1),
        "stage1_metrics": numeric,
        "env": environment_record()["env"],
        "torch_threads": torch.get_num_threads(),
    }))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
