"""FusedGRPOTrainer inside the real TRL (1.16): the same loss and gradients as GRPOTrainer's own on
the same batch for each supported option, two training steps that land on the same weights, and a
one-line refusal of what it does not support. Runs in .venv-integrations (make test-integrations)."""

import os

import pytest

from integration_env import require

require("trl")

import torch  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from mopd_kernels.integrations.trl import FusedGRPOTrainer, UnsupportedOption  # noqa: E402
from tiny_models import grpo_dataset, reward_len, tiny_causal_lm_dir  # noqa: E402

pytestmark = pytest.mark.integration

os.environ.setdefault("HF_HUB_OFFLINE", "1")
B, P, C = 6, 5, 9   # completions, prompt and completion lengths


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_causal_lm_dir(tmp_path_factory.mktemp("trl_model"), vocab=211, hidden=48)


@pytest.fixture(scope="module")
def arch_dir(tmp_path_factory, model_dir):
    """``arch -> directory`` of a tiny model of that architecture (``tiny_models.ARCHS``), built once."""
    built = {"qwen2": model_dir}

    def get(arch):
        if arch not in built:
            built[arch] = tiny_causal_lm_dir(tmp_path_factory.mktemp(f"trl_{arch}"), vocab=211, hidden=48, arch=arch)
        return built[arch]
    return get


def _biased_head(model, seed=5):
    """``model``'s lm head replaced by one with the same weight and a random bias (Phi-2, GPT-J)."""
    old = model.lm_head
    head = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(old.weight)
        head.bias.copy_(torch.randn(old.out_features, generator=torch.Generator().manual_seed(seed)))
    model.lm_head = head
    return model


def _trainer(cls, model_dir, tmp_path, *, lm_head_bias=False, **config):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    defaults = dict(output_dir=str(tmp_path / cls.__name__), per_device_train_batch_size=4, num_generations=4,
                    max_completion_length=C, max_steps=2, learning_rate=1e-2, logging_steps=1, report_to="none",
                    use_vllm=False, bf16=False, use_cpu=True, save_strategy="no", beta=0.0, seed=0,
                    dataloader_num_workers=0, temperature=0.7)
    defaults.update(config)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    if lm_head_bias:
        model = _biased_head(model)
    return cls(model=model, reward_funcs=reward_len,
               args=GRPOConfig(**defaults), train_dataset=grpo_dataset(),
               processing_class=AutoTokenizer.from_pretrained(model_dir))


def _batch(vocab, *, old=True, ref=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([C, 5, 1, 0, 7, 3])
    completion_mask = (torch.arange(C).unsqueeze(0) < lengths.unsqueeze(1)).long()
    inputs = {"prompt_ids": torch.randint(3, vocab, (B, P), generator=g),
              "prompt_mask": torch.ones(B, P, dtype=torch.long),
              "completion_ids": torch.randint(3, vocab, (B, C), generator=g),
              "completion_mask": completion_mask,
              "advantages": torch.randn(B, generator=g),
              "num_items_in_batch": completion_mask.sum().float() * 1.5}
    inputs["prompt_mask"][1, :2] = 0   # left padding
    return inputs, g


def _scored(trainer, inputs, g, old, ref):
    """Old and reference log-probs near the model's own, so ratios fall on both sides of the clip."""
    model = trainer.model
    with torch.no_grad():
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, P - 1:-1].float() / trainer.temperature
        logp = torch.log_softmax(logits, -1).gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)
    out = dict(inputs)
    if old:
        out["old_per_token_logps"] = logp + 0.3 * torch.randn(logp.shape, generator=g)
    if ref:
        out["ref_per_token_logps"] = logp + 0.3 * torch.randn(logp.shape, generator=g)
    return out


def _loss_and_grads(trainer, inputs):
    trainer.current_gradient_accumulation_steps = 2   # as Trainer sets it in a window of two micro-batches
    trainer.model.train()
    trainer.model.zero_grad()
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    return float(loss.detach()), grads


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30))


CASES = {
    "grpo": dict(loss_type="grpo"),
    "bnpo": dict(loss_type="bnpo", entropy_coef=0.01),
    "dr_grpo": dict(loss_type="dr_grpo"),
    "dapo": dict(loss_type="dapo"),
    "grpo-beta-bias-corrected": dict(loss_type="grpo", beta=0.04),              # TRL's defaults for the KL
    "dapo-beta-uncorrected": dict(loss_type="dapo", beta=0.04, use_bias_correction_kl=False),
    "bnpo-delta": dict(loss_type="bnpo", delta=1.6, epsilon_high=0.28),
    "grpo-gspo": dict(loss_type="grpo", importance_sampling_level="sequence", beta=0.04),
    "dapo-gspo": dict(loss_type="dapo", importance_sampling_level="sequence"),
    "cispo": dict(loss_type="cispo", epsilon_high=4.0, beta=0.04),
    "sapo": dict(loss_type="sapo", entropy_coef=0.01),
    "grpo-on-policy": dict(loss_type="grpo", beta=0.04, on_policy=True),
    # sequence-level importance sampling with cispo and sapo: computed as TRL computes it
    "cispo-sequence": dict(loss_type="cispo", importance_sampling_level="sequence", epsilon_high=1.3,
                           entropy_coef=0.01),
    "sapo-sequence": dict(loss_type="sapo", importance_sampling_level="sequence", beta=0.04),
    # an lm head with a bias, its gradient compared with the rest
    "grpo-lm-head-bias": dict(loss_type="grpo", entropy_coef=0.01, lm_head_bias=True),
    "dapo-lm-head-bias-gspo": dict(loss_type="dapo", importance_sampling_level="sequence", lm_head_bias=True),
    # 0.4: LUSPO (sequence sums averaged over the batch) and VESPO (the gamma-weighted REINFORCE)
    "luspo-gspo": dict(loss_type="luspo", importance_sampling_level="sequence", beta=0.04),
    "luspo": dict(loss_type="luspo", entropy_coef=0.01),
    "vespo": dict(loss_type="vespo"),
    "vespo-beta-entropy": dict(loss_type="vespo", beta=0.04, entropy_coef=0.01),
    # the off-policy sequence mask and the entropy filter
    "grpo-off-policy-mask": dict(loss_type="grpo", off_policy_mask_threshold=0.0, beta=0.04),
    "dapo-gspo-off-policy-mask": dict(loss_type="dapo", importance_sampling_level="sequence",
                                      off_policy_mask_threshold=0.02),
    "grpo-entropy-filter": dict(loss_type="grpo", top_entropy_quantile=0.4, entropy_coef=0.01),
    "dapo-entropy-filter": dict(loss_type="dapo", top_entropy_quantile=0.7, beta=0.04),
    # heads that cap or scale their logits, and a MoE model's router loss
    "gemma2-softcap": dict(loss_type="grpo", beta=0.04, entropy_coef=0.01, arch="gemma2"),
    "gemma2-softcap-gspo": dict(loss_type="dapo", importance_sampling_level="sequence", arch="gemma2"),
    "cohere-logit-scale": dict(loss_type="bnpo", entropy_coef=0.01, arch="cohere"),
    "qwen3-moe-aux-loss": dict(loss_type="grpo", beta=0.04, arch="qwen3_moe"),
}


def _metrics(trainer):
    """The last value of each metric this micro-batch logged, as numbers (ours are device tensors)."""
    return {k: float(v[-1]) for k, v in trainer._metrics["train"].items() if v}


@pytest.mark.parametrize("name", list(CASES))
def test_same_loss_and_gradients_as_grpo_trainer_fp32(name, arch_dir, tmp_path):
    case = dict(CASES[name])
    on_policy = case.pop("on_policy", False)
    model_dir = arch_dir(case.pop("arch", "qwen2"))
    theirs = _trainer(GRPOTrainer, model_dir, tmp_path, **case)
    ours = _trainer(FusedGRPOTrainer, model_dir, tmp_path, **case)
    inputs, g = _batch(theirs.model.config.vocab_size)
    inputs = _scored(theirs, inputs, g, old=not on_policy, ref=theirs.beta != 0.0)
    want_loss, want = _loss_and_grads(theirs, inputs)
    got_loss, got = _loss_and_grads(ours, inputs)
    assert abs(got_loss - want_loss) <= 1e-5 * max(1.0, abs(want_loss)), (got_loss, want_loss)
    assert set(got) == set(want)
    for n in want:
        assert _rel(got[n], want[n]) < 1e-5, (n, _rel(got[n], want[n]))
    if case.get("lm_head_bias"):
        assert "lm_head.bias" in got and float(got["lm_head.bias"].abs().sum()) > 0
    # no host sync per micro-batch: our metrics wait on the device until log() (entropy_coef is a number)
    assert all(isinstance(v[-1], torch.Tensor) for k, v in ours._metrics["train"].items() if k != "entropy_coef")
    mine, trl = _metrics(ours), _metrics(theirs)
    if case.get("importance_sampling_level") == "sequence":
        # TRL's sequence-level low_min counts the batch's empty completion (sequence 3) as unclipped
        trl.pop("clip_ratio/low_min", None), mine.pop("clip_ratio/low_min", None)
    assert set(mine) == set(trl), set(mine) ^ set(trl)
    for key, want_value in trl.items():
        assert abs(mine[key] - want_value) < 1e-5 * max(1.0, abs(want_value)), (key, mine[key], want_value)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_entropy_bonus_scale(loss_type, model_dir, tmp_path):
    """TRL's check of the entropy bonus, on our logs: the loss is the logged ``policy_loss`` (over the
    accumulation steps for the grpo family, whose normaliser holds them for dapo) minus
    ``entropy_coef`` times the logged entropy over the accumulation steps -- for both trainers, with
    the same numbers."""
    coef, accum = 0.05, 2
    values = {}
    for cls in (GRPOTrainer, FusedGRPOTrainer):
        trainer = _trainer(cls, model_dir, tmp_path, loss_type=loss_type, entropy_coef=coef)
        inputs, g = _batch(trainer.model.config.vocab_size, seed=3)
        inputs = _scored(trainer, inputs, g, old=True, ref=False)
        loss, _ = _loss_and_grads(trainer, inputs)
        m = _metrics(trainer)
        policy = m["policy_loss"] / (accum if loss_type != "dapo" else 1)
        assert abs(loss - (policy - coef * m["entropy"] / accum)) < 1e-6 * max(1.0, abs(loss)), (cls, m, loss)
        values[cls] = (loss, m["policy_loss"], m["entropy"])
    for want, got in zip(values[GRPOTrainer], values[FusedGRPOTrainer], strict=True):
        assert abs(got - want) < 1e-5 * max(1.0, abs(want))


def test_train_with_static_entropy(model_dir, tmp_path):
    """Two training steps with a static entropy bonus log what TRL's do: ``policy_loss``,
    ``entropy_coef`` (constant), ``entropy``, the clip ratios with their per-sequence extremes."""
    logged = {}
    for cls in (GRPOTrainer, FusedGRPOTrainer):
        trainer = _trainer(cls, model_dir, tmp_path, loss_type="grpo", entropy_coef=0.01)
        trainer.train()
        logged[cls] = [e for e in trainer.state.log_history if "loss" in e]
    for entry in logged[FusedGRPOTrainer]:
        assert entry["entropy_coef"] == 0.01
        for key in ("policy_loss", "entropy", "clip_ratio/low_min", "clip_ratio/high_max"):
            assert isinstance(entry[key], float), (key, entry)
    assert [sorted(e) for e in logged[FusedGRPOTrainer]] == [sorted(e) for e in logged[GRPOTrainer]]


def test_adaptive_entropy_moves_and_applies_the_coefficient_as_trl_does(model_dir, tmp_path):
    """Two micro-batches, each its own optimizer step, under adaptive entropy control: the bonus applies
    the last step's coefficient while the measured entropy is at most the target, and each step moves
    it by ``entropy_coef_delta``: the same losses, gradients, coefficients and logs as TRL's."""
    config = dict(loss_type="dapo", use_adaptive_entropy=True, entropy_coef=0.02, entropy_coef_delta=0.01,
                  entropy_target=6.0, top_entropy_quantile=0.5)
    runs = {}
    for cls in (GRPOTrainer, FusedGRPOTrainer):
        trainer = _trainer(cls, model_dir, tmp_path, **config)
        trainer._last_world_entropy = 0.0   # as if the last step measured an entropy under the target
        steps = []
        for seed in (4, 5):
            inputs, g = _batch(trainer.model.config.vocab_size, seed=seed)
            loss, grads = _loss_and_grads(trainer, _scored(trainer, inputs, g, old=True, ref=False))
            steps.append((loss, grads, trainer.entropy_coef, trainer._last_world_entropy, _metrics(trainer)))
        runs[cls] = steps
    for want, got in zip(runs[GRPOTrainer], runs[FusedGRPOTrainer], strict=True):
        assert abs(got[0] - want[0]) <= 1e-5 * max(1.0, abs(want[0]))
        assert all(_rel(got[1][n], want[1][n]) < 1e-5 for n in want[1])
        assert got[2] == pytest.approx(want[2], abs=1e-12) and got[3] == pytest.approx(want[3], rel=1e-5)
        assert set(got[4]) == set(want[4])
        assert all(abs(got[4][k] - v) < 1e-5 * max(1.0, abs(v)) for k, v in want[4].items())
    assert runs[GRPOTrainer][1][2] == pytest.approx(0.04)   # moved up twice: under 6 nats (ln 211 = 5.35)


BF16_TOL = {"loss": 1e-4, "grad": 2e-2}
"""Under bf16 autocast both lm heads round the logits to bf16 (as F.linear does), but in different
tiles and with fp32 softmaxes summed in another order, so they agree to bf16's precision only.
Measured on this batch (2026-12-05): loss 4e-9 to 1.5e-8 relative, lm-head gradient 2.8e-3 to 3.3e-3,
the largest over all parameters 9e-3 to 1.3e-2."""


@pytest.mark.parametrize("name", ["grpo-beta-bias-corrected", "dapo"])
def test_close_to_grpo_trainer_under_trl_defaults_bf16_autocast(name, model_dir, tmp_path):
    case = dict(CASES[name], bf16=True)
    theirs = _trainer(GRPOTrainer, model_dir, tmp_path, **case)
    ours = _trainer(FusedGRPOTrainer, model_dir, tmp_path, **case)
    inputs, g = _batch(theirs.model.config.vocab_size, seed=1)
    inputs = _scored(theirs, inputs, g, old=True, ref=theirs.beta != 0.0)
    want_loss, want = _loss_and_grads(theirs, inputs)
    got_loss, got = _loss_and_grads(ours, inputs)
    assert abs(got_loss - want_loss) <= BF16_TOL["loss"] * max(1.0, abs(want_loss))
    head = [n for n in want if "lm_head" in n or "embed_tokens" in n][0]
    assert _rel(got[head], want[head]) < BF16_TOL["grad"]


def test_two_training_steps_land_on_the_same_weights(model_dir, tmp_path):
    # Each is built (and seeded) right before it trains, so both sample the same completions. SGD:
    # Adam would scale a gradient that is only rounding noise (the KL term at step 1, where the two
    # lm heads' log-probs of the same weights differ in the 7th digit) up to a full-size step.
    config = dict(loss_type="dapo", beta=0.04, optim="sgd", learning_rate=0.5)
    theirs = _trainer(GRPOTrainer, model_dir, tmp_path, **config)
    theirs.train()
    ours = _trainer(FusedGRPOTrainer, model_dir, tmp_path, **config)
    before = {n: p.detach().clone() for n, p in ours.model.named_parameters()}
    ours.train()
    assert ours.state.global_step == theirs.state.global_step == 2
    moved = 0.0
    for (n, p), (_, q) in zip(ours.model.named_parameters(), theirs.model.named_parameters()):
        assert _rel(p.detach(), q.detach()) < 1e-4, n
        moved = max(moved, float((p.detach() - before[n]).abs().max()))
    assert moved > 1e-4  # the steps trained
    logged = [e for e in ours.state.log_history if "loss" in e]
    assert logged and all(k in logged[0] for k in ("kl", "entropy", "clip_ratio/region_mean"))


@pytest.mark.parametrize("option,value", [("delta", 1.1)])
def test_refuses_what_it_does_not_compute_in_one_line(option, value, model_dir, tmp_path):
    with pytest.raises(UnsupportedOption) as e:
        _trainer(FusedGRPOTrainer, model_dir, tmp_path, **{option: value, "epsilon_high": 0.28})
    message = str(e.value)
    assert option in message and "\n" not in message
