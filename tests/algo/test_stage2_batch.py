"""Stage II end to end on the method side: records -> rewards -> advantages -> token signals ->
the fused loss (reference backend), checked against the formulas computed by hand."""

import math

import torch

from mopd.algo.advantages import call_token_signals, role_advantages, role_specs
from mopd.algo.rewards import kl_in_reward, role_rewards
from mopd.config import resolve
from mopd.core.roles import role_id
from mopd_kernels import LossInputs, PolicyLossSettings, fused_linear_policy_loss
from tests.helpers.records import call, record, search


def test_stage2_batch_loss_equals_hand_computation():
    cfg = resolve("mopd")
    recs = []
    # two trajectories of one question: the first answers right and searches at 2 steps
    for i, (ans, steps) in enumerate([("<answer>Paris</answer>", [0, 1]), ("<answer>Rome</answer>", [])]):
        calls = [call("l0", "leader", ["<subtask>x</subtask>"]),
                 call("s0", "searcher", ["<search>a</search>", "<report>r</report>"]),
                 call("a0", "answerer", [ans], group=f"req{i}"),
                 call("a1", "answerer", ["<answer>paris</answer>"], group=f"req{i}")]
        recs.append(record(attempt=i, candidates=[ans, "<answer>paris</answer>"], calls=calls,
                           events=[search(s, "s0") for s in steps]))
    kl = [{"l0": 1.0, "a0": 2.0, "a1": 0.0}, {"l0": -1.0, "a0": 0.5, "a1": 0.0}]
    rewards = [kl_in_reward(role_rewards(r, cfg.reward), r, k, cfg.reward.kl_roles, cfg.reward.kl_coef)
               for r, k in zip(recs, kl)]
    # by hand: both teams answer right (candidate a1 = 'paris'); R_assign = 2/6 and 0
    assert rewards[0]["l0"] == 1 + 0.2 * 2 / 6 - 1e-3 * 1.0
    assert rewards[1]["l0"] == 1 + 0.0 + 1e-3 * 1.0
    assert rewards[0]["a0"] == 1 - 2e-3 and rewards[1]["a0"] == 0 - 0.5e-3
    assert "s0" not in rewards[0]
    advs = role_advantages(recs, rewards, eps=cfg.algo.adv_eps)
    d = rewards[0]["l0"] - rewards[1]["l0"]
    std = abs(d) / math.sqrt(2)                          # sample std of two values
    assert abs(advs[0]["l0"] - (d / 2) / (std + 1e-6)) < 1e-5
    assert abs(advs[1]["l0"] + (d / 2) / (std + 1e-6)) < 1e-5

    calls = [c for r in recs for c in r.calls]
    per_call = [advs[i].get(c.call_id) for i, r in enumerate(recs) for c in r.calls]
    signals = [call_token_signals(c, a) for c, a in zip(calls, per_call, strict=True)]
    roles = torch.tensor([r for rl, _ in signals for r in rl])
    adv = torch.tensor([v for _, av in signals for v in av])
    T = roles.numel()
    g = torch.Generator().manual_seed(0)
    H, V = 16, 23
    hidden = torch.randn(T, H, generator=g, dtype=torch.float64).float().requires_grad_()
    weight = torch.randn(V, H, generator=g).requires_grad_()
    targets = torch.randint(0, V, (T,), generator=g)
    old = torch.randn(T, generator=g) - 3
    teacher = torch.randn(T, generator=g) - 3
    specs = role_specs(cfg.algo)
    loss, _ = fused_linear_policy_loss(hidden, weight, targets,
                                       LossInputs(roles=roles, old_logp=old, advantages=adv, teacher_logp=teacher),
                                       PolicyLossSettings(role_specs=specs, backend="reference"))

    # the formulas, token by token
    logp_all = torch.log_softmax(hidden @ weight.T, -1)
    total, n = 0.0, 0
    for t in range(T):
        r = int(roles[t])
        if r < 0:
            continue
        n += 1
        s = specs[r]
        lp = logp_all[t, targets[t]]
        A = s.opd_coef * (teacher[t] - old[t]) if s.advantage == "opd" else adv[t]
        ratio = torch.exp(lp - old[t])
        pg = torch.maximum(-A * ratio, -A * torch.clamp(ratio, 0.8, 1.2))
        p = logp_all[t].exp()
        H_t = -(p * logp_all[t]).sum()
        total = total + s.pg_coef * pg - s.entropy_coef * H_t
    assert n == int((roles >= 0).sum()) and n > 0
    assert torch.allclose(loss, total / n, atol=1e-6)
    assert set(roles[roles >= 0].tolist()) == {role_id("leader"), role_id("searcher"), role_id("answerer")}


def test_judge_reports_batches_all_reports_through_the_engine():
    from mopd.algo.critic import JudgeItem, judge_reports
    from mopd.core.generation import Completion

    class Tok:
        def apply_chat_template(self, messages, add_generation_prompt, tokenize):
            return [len(m["content"]) for m in messages]

    class Engine:
        def __init__(self):
            self.calls = []

        def generate(self, requests):
            self.calls.append(requests)
            texts = ["<verdict>yes</verdict>", "<verdict>no</verdict>", "I am not sure"]
            return [[Completion([1], [0.0], "stop", texts[i % 3])] for i in range(len(requests))]

    eng = Engine()
    items = [JudgeItem(f"k{i}", "Q?", f"sub {i}", f"report {i}") for i in range(5)]
    scores, bad = judge_reports(eng, Tok(), items)
    assert len(eng.calls) == 1 and len(eng.calls[0]) == 5          # one batch for the whole step
    assert scores == {"k0": 1.0, "k1": 0.0, "k2": 0.0, "k3": 1.0, "k4": 0.0} and bad == 1
    assert judge_reports(eng, Tok(), []) == ({}, 0)
