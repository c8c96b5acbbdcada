import pytest

from mopd.algo.rewards import (
    assignment_reward,
    behaviour_bonus,
    candidate_scores,
    kl_in_reward,
    role_rewards,
    search_bonus,
    search_steps,
    team_outcome,
)
from mopd.config import RewardConfig, resolve
from mopd.core.records import Event
from tests.helpers.records import call, record, search


def test_team_outcome():
    assert team_outcome([]) == 0.0
    assert team_outcome([0.0, 1.0, 0.0]) == 1.0
    assert team_outcome([0.0]) == 0.0


def test_search_bonus_and_assignment():
    assert [search_bonus(n) for n in (0, 1, 2, 5)] == [0.0, 0.5, 1.0, 1.0]
    assert [assignment_reward(c) for c in (0, 1, 3, 6, 9)] == [0, 1 / 6, 0.5, 1.0, 1.0]
    assert assignment_reward(2, cap=4) == 0.5


def test_search_steps_counts_steps_not_actions():
    rec = record(events=[search(0, "s0"), search(0, "s1"), search(2, "s0"), search(3, "s1", q="  ")])
    assert search_steps(rec) == 2            # steps 0 and 2; the empty query at step 3 is no action
    assert search_steps(rec, "s0") == 2 and search_steps(rec, "s1") == 1


def report(step, cid):
    return Event("report", step, cid, "r")


def stage1_record(cands, n_search_steps, invalid_searcher=False, attempt=0, reported=True):
    s = call("s0", "searcher", ["<search>a</search>", "<report>r</report>"], invalid=invalid_searcher)
    answerers = [call(f"a{j}", "answerer", [c], group="g") for j, c in enumerate(cands)]
    events = [search(k, "s0") for k in range(n_search_steps)] + ([report(n_search_steps, "s0")] if reported else [])
    return record(attempt=attempt, candidates=cands, calls=[s, *answerers], events=events, workflow="cmas")


def test_stage1_rewards_by_hand():
    cfg = resolve("cmas_rl").reward
    rec = stage1_record(["<answer>paris</answer>", "<answer>Lyon</answer>", "no tag"], 1)
    assert candidate_scores(rec) == [1.0, 0.0, 0.0]
    r = role_rewards(rec, cfg)
    assert r == {"a0": 1.0, "a1": 0.0, "a2": -1.0, "s0": 1.0 + 0.2 * 0.5}
    rec2 = stage1_record(["<answer>Lyon</answer>"], 3)
    assert role_rewards(rec2, cfg)["s0"] == pytest.approx(0.2)
    rec3 = stage1_record(["<answer>Paris</answer>"], 2, invalid_searcher=True)
    assert role_rewards(rec3, cfg)["s0"] == -1.0


def hmas_record(cands, search_steps_, leader_invalid=False, attempt=0, searchers=2):
    leader = call("l0", "leader", ["<subtask>x</subtask>", "<select>1</select>"], invalid=leader_invalid)
    ss = [call(f"s{k}", "searcher", ["<search>a</search>", "<report>r</report>"]) for k in range(searchers)]
    answerers = [call(f"a{j}", "answerer", [c], group="g") for j, c in enumerate(cands)]
    return record(attempt=attempt, candidates=cands, calls=[leader, *ss, *answerers],
                  events=[search(k, "s0") for k in search_steps_] + [report(20, f"s{k}") for k in range(searchers)])


def test_stage2_leader_reward_by_hand():
    cfg = resolve("mopd").reward
    rec = hmas_record(["<answer>Paris</answer>"], [1, 2, 4])
    r = role_rewards(rec, cfg)
    assert r["l0"] == pytest.approx(1.0 + 0.2 * 3 / 6)
    assert "s0" not in r and "s1" not in r           # OPD Searchers have no outcome reward
    assert role_rewards(hmas_record(["x"], [], leader_invalid=True), cfg)["l0"] == -1.0
    many = hmas_record(["<answer>no</answer>"], list(range(9)))
    assert role_rewards(many, cfg)["l0"] == pytest.approx(0.2)   # capped at 6 steps


def test_outcome_searcher_and_critic():
    rec = hmas_record(["<answer>Paris</answer>"], [0, 1])
    r = role_rewards(rec, resolve("outcome_searcher").reward)
    assert r["s0"] == r["s1"] == 1.0
    crit = resolve("prompted_critic").reward
    with pytest.raises(ValueError, match="judge"):
        role_rewards(rec, crit)
    r = role_rewards(rec, crit, judge={"s0": 1.0, "s1": 0.0})
    # s0 searched at steps 0 and 1 (b_S = 1), s1 never searched (b_S = 0)
    assert r["s0"] == pytest.approx(0.3 + 0.5 + 0.2)
    assert r["s1"] == pytest.approx(0.3)


def test_no_candidate_scores_zero():
    rec = hmas_record([], [0])
    assert role_rewards(rec, RewardConfig(roles={"leader": "team"}))["l0"] == 0.0


def test_kl_in_reward_by_hand():
    cfg = resolve("mopd").reward
    rec = hmas_record(["<answer>Paris</answer>", "<answer>x</answer>"], [0])
    r = role_rewards(rec, cfg)
    kl = {"l0": 2.0, "a0": 10.0, "a1": -4.0}
    out = kl_in_reward(r, rec, kl, cfg.kl_roles, cfg.kl_coef)
    assert out["l0"] == pytest.approx(r["l0"] - 1e-3 * 2.0)
    assert out["a0"] == pytest.approx(1.0 - 1e-2) and out["a1"] == pytest.approx(0.0 + 4e-3)
    with pytest.raises(ValueError, match="a1"):
        kl_in_reward(r, rec, {"l0": 1.0, "a0": 1.0}, cfg.kl_roles, cfg.kl_coef)
    assert kl_in_reward(r, rec, {}, cfg.kl_roles, 0.0) == r


def test_search_bonus_is_paid_only_with_a_report():
    cfg = resolve("cmas_rl").reward
    for steps, bonus in ((0, 0.0), (1, 0.5), (3, 1.0)):
        rec = stage1_record(["<answer>Lyon</answer>"], steps)
        assert behaviour_bonus(rec) == bonus
        assert role_rewards(rec, cfg)["s0"] == pytest.approx(0.2 * bonus)
        silent = stage1_record(["<answer>Lyon</answer>"], steps, reported=False)
        assert behaviour_bonus(silent) == 0.0 and role_rewards(silent, cfg)["s0"] == 0.0
    # critic, per call: s0 searched twice but never reported, s1 searched once and reported
    rec = record(calls=[call("s0", "searcher", ["<search>a</search>"]), call("s1", "searcher", ["x"])],
                 events=[search(1, "s0"), search(2, "s0"), search(1, "s1"), report(2, "s1")])
    assert (behaviour_bonus(rec, "s0"), behaviour_bonus(rec, "s1"), behaviour_bonus(rec)) == (0.0, 0.5, 0.5)


def test_an_invalid_output_gets_exactly_the_invalid_reward_without_kl():
    cfg = resolve("mopd").reward
    rec = hmas_record(["<answer>Paris</answer>", "no tag"], [0], leader_invalid=True)
    r = role_rewards(rec, cfg)
    assert (r["l0"], r["a1"]) == (-1.0, -1.0)
    out = kl_in_reward(r, rec, {"l0": 3.0, "a0": 5.0, "a1": 7.0}, cfg.kl_roles, cfg.kl_coef)
    assert out["l0"] == -1.0 and out["a1"] == -1.0
    assert out["a0"] == pytest.approx(1.0 - 5e-3)       # a valid candidate still pays its KL


def test_every_reward_registers_itself_with_its_coefficients():
    from mopd.algo.rewards import CandidateEM, Critic, NoReward, Team, TeamAssign, TeamBonus, reward_of
    from mopd.config import REWARDS

    # the config's names are the classes' own registrations: nothing else lists them
    assert dict(REWARDS) == {"team": Team, "team_bonus": TeamBonus, "team_assign": TeamAssign,
                             "candidate_em": CandidateEM, "critic": Critic, "none": NoReward}
    cfg = RewardConfig(bonus_coef=0.35, assign_coef=0.15, assign_cap=4, critic_em=0.1, critic_judge=0.7,
                       critic_bonus=0.05)
    assert reward_of("team_bonus", cfg) == TeamBonus(0.35)
    assert reward_of("team_assign", cfg) == TeamAssign(0.15, 4)
    critic = reward_of("critic", cfg)
    assert critic == Critic(0.1, 0.7, 0.05) and critic.per_call and critic.needs_judge
    assert not reward_of("team", cfg).needs_judge and reward_of("candidate_em", cfg).per_call
    with pytest.raises(ValueError, match="unknown reward"):
        reward_of("bonus", cfg)


def test_a_role_can_take_any_reward_by_name():
    """reward.roles chooses the object: the Leader paid with the Searcher's bonus reward gets
    R_EM + bonus_coef * b_S, not its default assignment reward."""
    rec = hmas_record(["<answer>Paris</answer>"], [0])
    default = role_rewards(rec, RewardConfig())
    swapped = role_rewards(rec, RewardConfig(roles={"leader": "team_bonus"}, bonus_coef=0.4))
    assert default["l0"] == pytest.approx(1.0 + 0.2 * 1 / 6)      # R_EM + 0.2 R_assign, one search step
    assert swapped["l0"] == pytest.approx(1.0 + 0.4 * 0.5)         # R_EM + 0.4 b_S, b_S = 0.5 after one step
