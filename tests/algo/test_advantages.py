import math

import pytest
import torch

from mopd.algo.advantages import (
    call_token_signals,
    group_normalize,
    role_advantages,
)
from mopd.core.roles import role_id
from tests.helpers.records import call, record


def test_group_normalize_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 5.0])
    g = ["a", "a", "a", "b", "b", "c"]
    adv = group_normalize(r, g, eps=0.0)
    # group a: mean 1/3, sample std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3)
    s = math.sqrt(1 / 3)
    assert adv[:3].tolist() == pytest.approx([(2 / 3) / s, (-1 / 3) / s, (-1 / 3) / s])
    # group b: mean 2, sample std sqrt(2)
    assert adv[3:5].tolist() == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2)])
    assert adv[5].item() == 0.0                     # a group of one


def test_group_normalize_equal_rewards_and_random_groups():
    assert group_normalize(torch.full((5,), 0.7), [0] * 5).tolist() == [0.0] * 5
    gen = torch.Generator().manual_seed(0)
    r = torch.randn(37, generator=gen)
    g = torch.randint(0, 6, (37,), generator=gen)
    adv = group_normalize(r, g, eps=1e-6)
    for k in g.unique():
        m = g == k
        if m.sum() > 1:
            expect = (r[m] - r[m].mean()) / (r[m].std() + 1e-6)
            assert torch.allclose(adv[m], expect.float(), atol=1e-5)
    assert torch.isfinite(adv).all()


def test_role_advantages_searchers_share_trajectory_advantage():
    recs, rewards = [], []
    for i, rs in enumerate([1.0, 0.0, 0.0]):
        s = [call(f"s{k}", "searcher", ["x"]) for k in range(i + 1)]   # 1, 2, 3 searcher calls
        recs.append(record(attempt=i, calls=s))
        rewards.append({f"s{k}": rs for k in range(i + 1)})
    adv = role_advantages(recs, rewards)
    s = math.sqrt(1 / 3)
    # normalised over the 3 trajectories (not over the 6 calls)
    assert adv[0]["s0"] == pytest.approx((2 / 3) / (s + 1e-6))
    assert adv[2]["s0"] == adv[2]["s1"] == adv[2]["s2"] == pytest.approx((-1 / 3) / (s + 1e-6))


def test_role_advantages_answerer_groups_by_request_and_roles_separately():
    recs, rewards = [], []
    for i in range(2):
        a = [call(f"a{j}", "answerer", ["x"], group=f"req{i}") for j in range(2)]
        lead = call("l0", "leader", ["x"])
        recs.append(record(attempt=i, calls=[lead, *a]))
        rewards.append({"l0": float(i), "a0": 1.0, "a1": 0.0 if i == 0 else 1.0})
    adv = role_advantages(recs, rewards, eps=0.0)
    assert adv[0]["a0"] == pytest.approx(0.5 / math.sqrt(0.5)) and adv[0]["a1"] == pytest.approx(-0.5 / math.sqrt(0.5))
    assert adv[1]["a0"] == adv[1]["a1"] == 0.0      # equal candidates of one request
    assert adv[0]["l0"] == pytest.approx(-0.5 / math.sqrt(0.5)) and adv[1]["l0"] == pytest.approx(0.5 / math.sqrt(0.5))


def test_role_advantages_per_call_critic_and_inconsistent_rewards():
    recs = [record(attempt=0, calls=[call("s0", "searcher", ["x"]), call("s1", "searcher", ["x"])])]
    rewards = [{"s0": 1.0, "s1": 0.0}]
    with pytest.raises(ValueError, match="different rewards"):
        role_advantages(recs, rewards)
    adv = role_advantages(recs, rewards, per_call_roles=("searcher",), eps=0.0)
    assert adv[0]["s0"] == pytest.approx(0.5 / math.sqrt(0.5))


def test_token_signals_land_on_model_tokens_only():
    c = call("s0", "searcher", ["<search>a</search>", "<report>r</report>"], env_len=3)
    roles, adv = call_token_signals(c, 0.75)
    sid = role_id("searcher")
    assert roles == [-1, -1, -1, sid, sid, -1, -1, -1, sid, sid]
    assert adv == [0, 0, 0, 0.75, 0.75, 0, 0, 0, 0.75, 0.75]
    assert [r >= 0 for r in roles] == [bool(m) for m in c.loss_mask()]
    a = call("a0", "answerer", ["<answer>x</answer>"], env_len=1)
    # an OPD call (advantage None) carries 0: the loss forms its advantage from the teacher
    assert call_token_signals(c, None) == (roles, [0.0] * len(roles))
    assert call_token_signals(a, -2.0) == ([-1, 2, 2], [0.0, -2.0, -2.0])


def test_two_copies_of_one_question_in_a_step_form_two_groups():
    """An epoch boundary can deal a question twice in one step: each copy's G runs (same question
    id, attempts 0..G-1 each) are their own group, for every role."""
    recs, rewards = [], []
    for copy, outcomes in enumerate(([1.0, 0.0], [1.0, 1.0])):
        for attempt, r in enumerate(outcomes):
            calls = [call("l0", "leader", ["x"]), call("s0", "searcher", ["x"]),
                     *[call(f"a{j}", "answerer", ["x"], group=f"nq/q1/{attempt}/a0") for j in range(2)]]
            rec = record(attempt=attempt, calls=calls)
            rec.group_id = f"nq/q1#{copy}"
            recs.append(rec)
            rewards.append({"l0": r, "s0": r, "a0": r, "a1": 0.0})
    adv = role_advantages(recs, rewards, eps=0.0)
    z = 0.5 / math.sqrt(0.5)
    assert [a["l0"] for a in adv] == pytest.approx([z, -z, 0.0, 0.0])
    assert [a["s0"] for a in adv] == pytest.approx([z, -z, 0.0, 0.0])
    # the Answerer requests of attempt 0 of both copies share a request id but not a group
    assert [a["a0"] for a in adv] == pytest.approx([z, 0.0, z, z])
    # merged by question id (records without a group id), the four runs would be one group
    for rec in recs:
        rec.group_id = ""
    assert [a["l0"] for a in role_advantages(recs, rewards, eps=0.0)][2] != 0.0
