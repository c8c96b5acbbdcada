"""The KL in the reward goes through the kernels' KL registry, its estimator a setting
(``reward.kl_type``; k1 by default, exactly old_logp - ref_logp as before)."""

import pytest
import torch
from mopd_kernels.kl import KL_ESTIMATORS, KL_TYPES, kl_penalty

from mopd.config import ConfigError, resolve
from tests.helpers.retrievers import FakeRetriever
from tests.helpers.tiny_model import init_tiny_model
from tests.helpers.training import tiny_overrides


@pytest.fixture(scope="module")
def reference_dir(tmp_path_factory):
    """A second tiny model with the train fixture's tokenizer and other weights (the KL reference)."""
    out = tmp_path_factory.mktemp("reference")
    return str(init_tiny_model(out, vocab_size=400, hidden=32, layers=1, heads=2, ffn=64, seed=1))


def test_k1_is_the_default_and_the_plain_log_ratio():
    assert resolve("mopd").reward.kl_type == "k1"
    g = torch.Generator().manual_seed(5)
    logp, ref = -torch.rand(37, generator=g) * 4, -torch.rand(37, generator=g) * 4
    assert torch.equal(kl_penalty(logp, ref), logp - ref)           # bit for bit what the trainer wrote inline
    assert torch.equal(kl_penalty(logp, ref, "k3"), torch.exp(ref - logp) - (ref - logp) - 1)
    with pytest.raises(ValueError, match="unknown KL estimator 'k9'"):
        kl_penalty(logp, ref, "k9")


def test_the_estimator_names_come_from_the_registry():
    with pytest.raises(ConfigError, match=r"reward.kl_type='k9' is not valid; choose one of \['k1', 'k2', 'k3'\]"):
        resolve("mopd", ["reward.kl_type=k9"])
    assert set(KL_TYPES) == set(KL_ESTIMATORS)


@pytest.mark.parametrize("estimator", list(KL_TYPES))
def test_one_step_trains_with_each_registered_estimator(estimator, tiny_model_dir, reference_dir, qa_file, tmp_path,
                                                        monkeypatch):
    import mopd.train.trainer as trainer_module
    from mopd.train.trainer import PolicyTrainer

    seen = {}
    real_penalty, real_advantages = trainer_module.kl_penalty, trainer_module.step_advantages

    def penalty(logp, ref, name):
        seen.setdefault("tokens", []).append((logp, ref))
        seen["estimator"] = name
        return real_penalty(logp, ref, name)

    def advantages(cfg, records, kl_sums, judge):
        seen["kl_sums"] = kl_sums
        return real_advantages(cfg, records, kl_sums, judge)

    monkeypatch.setattr(trainer_module, "kl_penalty", penalty)
    monkeypatch.setattr(trainer_module, "step_advantages", advantages)
    cfg = resolve("cmas_rl", tiny_overrides(tiny_model_dir, qa_file, tmp_path / "run", **{
        "reference.path": reference_dir, "reward.kl_coef": 0.5, "reward.kl_roles": "[answerer]",
        "reward.kl_type": estimator, "trainer.steps": 1}))
    t = PolicyTrainer(cfg, retriever=FakeRetriever(), progress=False)
    metrics = t.fit(1)
    assert metrics["loss/skipped_updates"] == 0.0
    assert seen["estimator"] == estimator and seen["kl_sums"]
    # the sums the rewards got are the estimator's, over each call's tokens
    per_token = [KL_ESTIMATORS[estimator](logp, ref) for logp, ref in seen["tokens"]]
    if estimator != "k1":
        assert any(not torch.equal(v, logp - ref) for v, (logp, ref) in zip(per_token, seen["tokens"]))
    if estimator in ("k2", "k3"):   # non-negative estimators
        assert all(s >= 0 for s in seen["kl_sums"].values())
