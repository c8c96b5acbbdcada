"""The demo exports each stage's best-validation checkpoint (the paper's model selection) through
`PolicyTrainer.export(which="best")`, which `mopd train --export` also uses."""

import pytest
import torch
from safetensors.torch import load_file

from mopd.config import resolve
from mopd.pipeline.inprocess import export_best
from mopd.train.trainer import PolicyTrainer
from tests.helpers.retrievers import FakeRetriever
from tests.helpers.training import tiny_overrides
from tests.train import conftest as train_fixtures

qa_file, tiny_model_dir = train_fixtures.qa_file, train_fixtures.tiny_model_dir   # the trainer tests' fixtures


def _weights(model_dir):
    (f,) = sorted(model_dir.glob("*.safetensors"))
    return load_file(str(f))


def _trainer(model_dir, qa_file, out):
    cfg = resolve("cmas_rl", tiny_overrides(model_dir, qa_file, out, **{
        "data.dev": qa_file, "trainer.val_every": 1, "trainer.checkpoint_every": 1, "trainer.keep_checkpoints": 1,
        "trainer.steps": 3, "trainer.questions_per_step": 1, "rollout.max_output_tokens": 6}))
    return PolicyTrainer(cfg, retriever=FakeRetriever(), progress=False)


def _fit(t, scores):
    t.validate = lambda: {"val/em": scores.pop(0)}
    t.fit()


def test_the_exported_model_is_the_best_dev_step_not_the_last(tiny_model_dir, qa_file, tmp_path):
    t = _trainer(tiny_model_dir, qa_file, tmp_path / "run")
    _fit(t, [0.9, 0.1, 0.5, 0.2])          # step 0 (the starting model) is not a candidate; step 2 is best
    try:
        t.export(tmp_path / "last")         # before: exporting "best" loads step 2's weights
        export_best("stage", t, tmp_path / "best", log=print)
    finally:
        t.close()
    from mopd.train.export import export_checkpoint

    export_checkpoint(tmp_path / "run", tmp_path / "step2", which="2")
    best, last, step2 = (_weights(tmp_path / d) for d in ("best", "last", "step2"))
    assert best.keys() == step2.keys()
    assert all(torch.equal(best[k], step2[k]) for k in best)
    assert any(not torch.equal(best[k], last[k]) for k in best)


def test_the_last_step_is_exported_when_it_is_the_best(tiny_model_dir, qa_file, tmp_path):
    t = _trainer(tiny_model_dir, qa_file, tmp_path / "run")
    _fit(t, [0.0, 0.1, 0.2, 0.3])
    try:
        export_best("stage", t, tmp_path / "best", log=print)
        t.export(tmp_path / "last")
        with pytest.raises(ValueError, match="choose last or best"):
            t.export(tmp_path / "x", which="latest")
    finally:
        t.close()
    best, last = _weights(tmp_path / "best"), _weights(tmp_path / "last")
    assert all(torch.equal(best[k], last[k]) for k in best)
