"""Training throughput on CPU (tiny Qwen3 model): packed micro-batches with the fused loss head
against one sequence at a time with full logits (the naive per-call update).

    .venv/bin/pytest -q bench/bench_train.py --benchmark-only -s

Both variants do the same work: forward and backward of the same agent calls with the same
advantages and the PPO loss, then one optimizer step. Tokens per second count all tokens of the
sequences (prompt and generated).
"""

import random

import pytest
import torch

from mopd_kernels import (
    FusedLinearPolicyLoss,
    LossInputs,
    PolicyLossSettings,
    RoleSpec,
    reference_policy_loss,
)
from mopd.train.model import PackedCausalLM, load_causal_lm
from mopd.train.packing import build_packed_batch, pack_sequences

SPECS = [RoleSpec(entropy_coef=1e-3), RoleSpec(advantage="opd"), RoleSpec(entropy_coef=1e-3)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from tests.helpers.tiny_model import init_tiny_model

    d = init_tiny_model(tmp_path_factory.mktemp("m"), vocab_size=1024, hidden=128, layers=2, heads=4, ffn=384)
    model, _ = load_causal_lm(str(d), dtype=torch.float32, device=torch.device("cpu"))
    rng = random.Random(0)
    V = model.config.vocab_size
    # 24 agent calls of 60-400 tokens, like a tiny-world rollout step; half the tokens trained
    seqs = []
    for _ in range(24):
        n = rng.randint(60, 400)
        toks = [rng.randrange(V) for _ in range(n)]
        roles = [-1] * (n // 2) + [rng.choice([0, 1, 2])] * (n - n // 2)
        seqs.append((toks, roles, [rng.uniform(-1, 1)] * n, [-rng.uniform(0.5, 3)] * n))
    return model, seqs


def _packed_step(model, seqs, budget=8192):
    policy = PackedCausalLM(model)
    plan = pack_sequences([len(s[0]) for s in seqs], budget)
    batches = [build_packed_batch(*zip(*[seqs[i] for i in mb])) for mb in plan]
    n = float(sum(b.loss_tokens for b in batches))
    loss_fn = FusedLinearPolicyLoss(PolicyLossSettings(role_specs=SPECS))
    for b in batches:
        b.old_logp, b.teacher_logp = b.sampling_logp, b.sampling_logp - 0.1
        loss, _ = policy(b, loss_fn, normalizer=n)
        loss.backward()
    model.zero_grad(set_to_none=True)


def _naive_step(model, seqs):
    n = float(sum(sum(1 for r in s[1][1:] if r >= 0) for s in seqs))
    for toks, roles, adv, lp in seqs:
        hidden = model.model(input_ids=torch.tensor([toks])).last_hidden_state[0][:-1]
        t = torch.tensor(toks[1:])
        inputs = LossInputs(torch.tensor(roles[1:]), torch.tensor(lp[1:]), torch.tensor(adv[1:]),
                            teacher_logp=torch.tensor(lp[1:]) - 0.1)
        loss, _ = reference_policy_loss(hidden, model.lm_head.weight, t, inputs, PolicyLossSettings(SPECS),
                                        normalizer=n)
        loss.backward()
    model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("variant", ["naive_per_call", "packed_fused"])
def test_train_tokens_per_second(benchmark, setup, variant):
    model, seqs = setup
    fn = _packed_step if variant == "packed_fused" else _naive_step
    torch.set_num_threads(1)   # small ops: one thread is faster and stable on a shared box
    benchmark.pedantic(fn, args=(model, seqs), rounds=2, warmup_rounds=0)
    tokens = sum(len(s[0]) for s in seqs)
    tps = tokens / benchmark.stats.stats.median
    benchmark.extra_info["tokens_per_s"] = tps
    print(f"\n{variant}: {tokens} tokens, median {benchmark.stats.stats.median:.2f}s, {tps:,.0f} tokens/s")
