"""step_advantages: one step's rewards (KL in reward, critic verdicts) and role-wise advantages,
against numbers worked out by hand; the critic's items and team EM."""

import math

import pytest

from mopd.algo.advantages import step_advantages
from mopd.algo.critic import judge_items, verdicts_by_call
from mopd.algo.rewards import team_em
from mopd.config import resolve
from mopd.core.records import Event
from tests.helpers.records import call, record


def _hmas(attempt, cands, group="nq/q1#0"):
    calls = [call("l0", "leader", ["<select>1</select>"]),
             call("s0", "searcher", ["<report>r</report>"]),
             call("s1", "searcher", ["<report>r</report>"])]
    calls += [call(f"a0.{j}", "answerer", [c], group=f"g{attempt}") for j, c in enumerate(cands)]
    rec = record(attempt=attempt, candidates=cands, calls=calls,
                 events=[Event("report", 1, "s0", "first"), Event("report", 2, "s0", "last"),
                         Event("report", 1, "s1", "only")])
    rec.group_id = group
    rec.calls[1].parent = "sub 0"
    rec.calls[2].parent = "sub 1"
    return rec


def test_team_em_is_the_best_candidate():
    assert team_em(_hmas(0, ["<answer>Rome</answer>", "<answer>paris</answer>"])) == 1.0
    assert team_em(_hmas(0, ["<answer>Rome</answer>"])) == 0.0
    assert team_em(_hmas(0, [])) == 0.0


def test_kl_in_reward_and_groups_by_hand():
    cfg = resolve("mopd", ["reward.assign_coef=0"])          # R_L = R_EM - 1e-3 * KL
    recs = [_hmas(0, ["<answer>Paris</answer>", "<answer>Rome</answer>"]),
            _hmas(1, ["<answer>Rome</answer>", "<answer>Rome</answer>"])]
    kl = {(0, "l0"): 2.0, (0, "a0.0"): 1.0, (0, "a0.1"): -1.0,
          (1, "l0"): -3.0, (1, "a0.0"): 0.5, (1, "a0.1"): 0.0}
    rewards, adv = step_advantages(cfg, recs, kl_sums=kl)
    assert rewards[0]["l0"] == pytest.approx(1 - 2e-3) and rewards[1]["l0"] == pytest.approx(0 + 3e-3)
    assert rewards[0]["a0.0"] == pytest.approx(1 - 1e-3) and rewards[0]["a0.1"] == pytest.approx(0 + 1e-3)
    assert "s0" not in rewards[0] and "s0" not in adv[0]               # OPD Searchers: no outcome reward
    # Leader: two trajectories of one prompt -> +-1/sqrt(2) * (d/std) with the sample std
    d = rewards[0]["l0"] - rewards[1]["l0"]
    assert adv[0]["l0"] == pytest.approx((d / 2) / (abs(d) / math.sqrt(2) + 1e-6), rel=1e-5)
    assert adv[1]["l0"] == pytest.approx(-adv[0]["l0"])
    # Answerer: normalised within each request (g0 and g1), never across them
    assert adv[0]["a0.0"] > 0 > adv[0]["a0.1"] and adv[0]["a0.0"] == pytest.approx(-adv[0]["a0.1"])
    assert adv[1]["a0.0"] < adv[1]["a0.1"]                              # equal EM, KL decides


def test_kl_needs_the_reference():
    with pytest.raises(ValueError, match="reference"):
        step_advantages(resolve("mopd"), [_hmas(0, ["<answer>Paris</answer>"])])


def test_critic_rewards_are_per_call_and_normalised_per_prompt():
    cfg = resolve("prompted_critic", ["reward.kl_coef=0"])
    recs = [_hmas(0, ["<answer>Paris</answer>"]), _hmas(1, ["<answer>Rome</answer>"])]
    items = judge_items(recs)
    assert [(i.key, i.sub_query, i.summary) for i in items] == [
        ("0\ts0", "sub 0", "last"), ("0\ts1", "sub 1", "only"), ("1\ts0", "sub 0", "last"), ("1\ts1", "sub 1", "only")]
    judge = verdicts_by_call({"0\ts0": 1.0, "0\ts1": 0.0, "1\ts0": 1.0, "1\ts1": 1.0})
    assert judge == {(0, "s0"): 1.0, (0, "s1"): 0.0, (1, "s0"): 1.0, (1, "s1"): 1.0}
    rewards, adv = step_advantages(cfg, recs, judge=judge)
    c = cfg.reward
    assert rewards[0]["s1"] == pytest.approx(c.critic_em * 1 + c.critic_judge * 0)
    assert rewards[1]["s0"] == pytest.approx(c.critic_em * 0 + c.critic_judge * 1)
    # the four Searcher calls of the prompt form one group: their advantages sum to 0
    assert sum(adv[i][s] for i in (0, 1) for s in ("s0", "s1")) == pytest.approx(0, abs=1e-6)
    assert len({round(adv[i][s], 6) for i in (0, 1) for s in ("s0", "s1")}) == 3
