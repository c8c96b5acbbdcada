"""Small real runs for the reliability probes: checkpoints of the tiny model written by the
checkpoint code itself (no trainer, about a second), and a small BM25 index for `mopd train`."""

import json


from mopd.train import checkpoint as ckpt
from tests.helpers.checkpoints import model_and_optimizer, train_a_bit  # noqa: F401 (re-exported)


def write_run(run_dir, model_dir, steps=(1, 2, 3)):
    """A run directory (its run.json naming the base model) with a checkpoint at each of ``steps``
    (different weights each); returns ``{step: weights}``."""
    from mopd.core.fingerprint import model_fingerprint
    from mopd.train.run_dir import write_identity

    write_identity(run_dir, {"config": {"model.path": str(model_dir)}, "model": model_fingerprint(model_dir)})
    m, opt = model_and_optimizer(model_dir)
    weights = {}
    for step in steps:
        train_a_bit(m, opt, step)
        ckpt.save_checkpoint(run_dir, step, m, opt, {"model_path": str(model_dir)}, keep=10)
        weights[step] = {k: v.detach().clone() for k, v in m.state_dict().items()}
    return weights


def step_dir(run_dir, n):
    return run_dir / "checkpoints" / f"step_{n:06d}"


def small_index(tmp_path):
    from mopd.retriever import build_index
    from mopd.retriever.builder import IndexSpec

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f"Band {i}\nBand {i} was formed in town {i % 3}."})
                              + "\n" for i in range(12)))
    return build_index(corpus, tmp_path / "index", IndexSpec(index_kind="bm25"))


def trained_run(run_dir, model_dir, qa_file, steps=3):
    """A run of the trainer itself (run.json, a checkpoint after every step, the fake retriever)."""
    from mopd.config import resolve
    from mopd.train.run_dir import prepare_run_dir
    from mopd.train.trainer import PolicyTrainer
    from tests.helpers.retrievers import FakeRetriever
    from tests.helpers.training import tiny_overrides

    cfg = resolve("cmas_rl", tiny_overrides(model_dir, qa_file, run_dir, **{
        "trainer.checkpoint_every": 1, "trainer.keep_checkpoints": 10, "trainer.steps": steps,
        "trainer.questions_per_step": 1, "rollout.max_output_tokens": 6}))
    prepare_run_dir(cfg, resume=False)
    t = PolicyTrainer(cfg, retriever=FakeRetriever(), progress=False)
    try:
        t.fit()
    finally:
        t.close()
    return cfg


def weights_of(model_dir, checkpoint):
    """The model weights stored in ``checkpoint``, loaded into a fresh copy of the base model."""
    m, _ = model_and_optimizer(model_dir)
    ckpt.load_model_weights(checkpoint, m)
    return {k: v.detach().clone() for k, v in m.state_dict().items()}
