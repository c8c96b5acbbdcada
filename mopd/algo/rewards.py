"""Rewards of the three roles, from workflow records (docs/method.md).

Team outcome: ``R_EM = max_j c_j`` over the Answerer candidates of the workflow's answering
request, c_j the strict normalised exact match of candidate j (0 when there is no candidate).

Per role (coefficients from ``RewardConfig``):

- Answerer candidate j: ``c_j``.
- Searcher: ``team_bonus`` = R_EM + bonus_coef * b_S (Stage I), ``team`` = R_EM, ``critic`` =
  critic_em R_EM + critic_judge R_judge + critic_bonus b_S (per call), ``none`` (OPD: no reward).
  b_S = 0.5 when the Searcher reports after one search step, 1 after two or more, 0 otherwise
  (no report, no bonus: the paper pays it for "a summary after one search step").
- Leader: ``team_assign`` = R_EM + assign_coef * min(C_tool, cap) / cap, C_tool the environment
  steps holding at least one search action; ``team`` = R_EM.
- An output with an invalid action format makes its role's total reward ``invalid_reward`` (-1),
  exactly: the KL in reward is not subtracted from it (:func:`kl_in_reward`).

Trajectory-level roles (Leader, Searcher without critic) get one reward per workflow; every call
of that role in the workflow takes it. Answerer candidates and critic-scored Searcher calls get
one reward per call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from mopd.config import REWARDS, RewardConfig, register_reward
from mopd.core.records import AgentCall, WorkflowRecord
from mopd.core.roles import role as role_of
from mopd.core.roles import role_names
from mopd.core.scoring import exact_match, extract_answer


def team_outcome(candidate_scores: Sequence[float]) -> float:
    """R_EM = max_j c_j; 0.0 when there is no candidate."""
    return float(max(candidate_scores)) if len(candidate_scores) else 0.0


def team_em(record: WorkflowRecord) -> float:
    """R_EM of one workflow: the best strict EM over its Answerer candidates."""
    return team_outcome(candidate_scores(record))


def candidate_score(call: AgentCall, answers: Sequence[str]) -> float:
    """c_j: strict EM of one Answerer call's output."""
    return exact_match(extract_answer(call.model_text()), answers)


def candidate_scores(record: WorkflowRecord) -> List[float]:
    """c_j of the final answering request's candidates, in order."""
    return [exact_match(extract_answer(c), record.answers) for c in record.candidates]


def search_steps(record: WorkflowRecord, call_id: Optional[str] = None) -> int:
    """Environment steps holding at least one search action (of one call, or of any call)."""
    return len({e.step for e in record.events
                if e.kind == "search" and e.text.strip() and (call_id is None or e.call_id == call_id)})


def search_bonus(n_search_steps: int) -> float:
    """b_S of a Searcher that reported: 0.5 after one search step, 1 after two or more, 0 otherwise."""
    return 0.0 if n_search_steps <= 0 else (0.5 if n_search_steps == 1 else 1.0)


def behaviour_bonus(record: WorkflowRecord, call_id: Optional[str] = None) -> float:
    """b_S of one Searcher call, or of the workflow's Searchers together: only the search steps of
    calls that wrote a report count, so a Searcher that never reports earns no bonus."""
    reported = {e.call_id for e in record.events if e.kind == "report"}
    calls = [c.call_id for c in record.calls_of("searcher")] if call_id is None else [call_id]
    steps = {e.step for e in record.events
             if e.kind == "search" and e.text.strip() and e.call_id in reported and e.call_id in calls}
    return search_bonus(len(steps))


def assignment_reward(c_tool: int, cap: int = 6) -> float:
    """R_assign = min(C_tool, cap) / cap."""
    return min(max(c_tool, 0), cap) / cap


def answerer_invalid(call: AgentCall) -> bool:
    """An Answerer output without a complete <answer> tag is an invalid action."""
    return call.invalid or extract_answer(call.model_text()) is None


# --------------------------------------------------------------------------------------------
# One small reward per concept, each registered under the name the config gives it
# (``reward.roles.<role>=NAME``; ``mopd.config.REWARDS``). Adding a reward: a class like these (a
# ``__call__``, and ``from_config`` when it takes coefficients) with ``@register_reward("NAME")``.
# --------------------------------------------------------------------------------------------


@register_reward("team")
@dataclass(frozen=True)
class Team:
    """R_EM for every call of the role (the Leader's ``team``, the Searcher's outcome ablation)."""

    per_call = False
    needs_judge = False

    @classmethod
    def from_config(cls, cfg: RewardConfig) -> "Team":
        """The reward with ``cfg``'s coefficients (this one has none)."""
        return cls()

    def __call__(self, record: WorkflowRecord, calls: Sequence[AgentCall], r_em: float,
                 judge: Optional[Dict[str, float]]) -> Dict[str, float]:
        return {c.call_id: r_em for c in calls}

    def invalid(self, call: AgentCall) -> bool:
        return call.invalid


@register_reward("team_bonus")
@dataclass(frozen=True)
class TeamBonus(Team):
    """R_EM + coef * b_S, b_S over the role's reporting calls together (Stage I's Searcher)."""

    coef: float = 0.2

    @classmethod
    def from_config(cls, cfg):
        return cls(cfg.bonus_coef)

    def __call__(self, record, calls, r_em, judge):
        r = r_em + self.coef * behaviour_bonus(record)
        return {c.call_id: r for c in calls}


@register_reward("team_assign")
@dataclass(frozen=True)
class TeamAssign(Team):
    """R_EM + coef * R_assign, R_assign = min(C_tool, cap) / cap (the Leader in Stage II)."""

    coef: float = 0.2
    cap: int = 6

    @classmethod
    def from_config(cls, cfg):
        return cls(cfg.assign_coef, cfg.assign_cap)

    def __call__(self, record, calls, r_em, judge):
        r = r_em + self.coef * assignment_reward(search_steps(record), self.cap)
        return {c.call_id: r for c in calls}


@register_reward("candidate_em")
@dataclass(frozen=True)
class CandidateEM(Team):
    """c_j: each call's own answer EM (Answerer candidates); a call without a complete
    ``<answer>`` tag is an invalid action."""

    per_call = True

    def __call__(self, record, calls, r_em, judge):
        return {c.call_id: candidate_score(c, record.answers) for c in calls}

    def invalid(self, call):
        return answerer_invalid(call)


@register_reward("critic")
@dataclass(frozen=True)
class Critic(Team):
    """The prompted critic's per-call mix: em * R_EM + judge * R_judge + bonus * b_S of the call."""

    em: float = 0.3
    judge: float = 0.5
    bonus: float = 0.2
    per_call = True
    needs_judge = True

    @classmethod
    def from_config(cls, cfg):
        return cls(cfg.critic_em, cfg.critic_judge, cfg.critic_bonus)

    def __call__(self, record, calls, r_em, judge):
        if judge is None:
            raise ValueError("the critic reward needs the judge verdicts of the Searcher reports")
        missing = [c.call_id for c in calls if c.call_id not in judge]
        if missing:
            raise ValueError(f"no judge verdict for calls {missing} of {record.question_id}")
        return {c.call_id: self.em * r_em + self.judge * judge[c.call_id]
                + self.bonus * behaviour_bonus(record, c.call_id) for c in calls}


@register_reward("none")
@dataclass(frozen=True)
class NoReward(Team):
    """No outcome reward: the role learns from OPD, or not at all (its calls get no entry)."""

    def __call__(self, record, calls, r_em, judge):
        return {}


def reward_of(name: str, cfg: RewardConfig):
    """The reward object registered as ``name`` (``mopd.config.REWARDS``), with ``cfg``'s
    coefficients."""
    return REWARDS.lookup(name).from_config(cfg)


def role_reward_objects(cfg: RewardConfig) -> Dict[str, Team]:
    """Every role's reward object, by role name in role-id order."""
    return {name: reward_of(cfg.of(name), cfg) for name in role_names()}


def role_rewards(record: WorkflowRecord, cfg: RewardConfig,
                 judge: Optional[Dict[str, float]] = None) -> Dict[str, float]:
    """Reward of every call of the workflow, keyed by call_id (before KL and normalisation).

    ``judge`` maps call ids to the critic's 0/1 verdict (needed by a role whose reward is the
    critic's). A role whose reward is ``none`` gets no entry (its signal is OPD or nothing). An
    invalid output makes its role's reward ``cfg.invalid_reward``: the call's own for a per-call
    reward, every call's of the role for a trajectory reward.
    """
    r_em = team_outcome(candidate_scores(record))
    out: Dict[str, float] = {}
    for name, reward in role_reward_objects(cfg).items():
        calls = record.calls_of(name)
        if not calls:
            continue
        got = reward(record, calls, r_em, judge)
        if not got:
            continue
        if reward.per_call:
            out.update({cid: cfg.invalid_reward if reward.invalid(c) else got[cid]
                        for c in calls for cid in (c.call_id,)})
        elif any(reward.invalid(c) for c in calls):
            out.update({c.call_id: cfg.invalid_reward for c in calls})
        else:
            out.update(got)
    return out


def kl_in_reward(rewards: Dict[str, float], record: WorkflowRecord, kl_sums: Dict[str, float],
                 roles: Sequence[str], coef: float, cfg: Optional[RewardConfig] = None) -> Dict[str, float]:
    """Subtract ``coef * sum_t (old_logp - ref_logp)`` (k1, verl's apply_kl_penalty) per role, toward
    the KL reference (the Stage-I policy; the OPD teacher unless ``reference.path`` names another).

    ``kl_sums[call_id]`` is the sum over the call's model tokens. For a trajectory-level role
    (the Leader) the sum runs over all of the role's calls in the workflow, so every call keeps
    the same reward; Answerer candidates are penalised by their own tokens. An invalid output's
    reward stays exactly ``invalid_reward`` (the paper's total reward of -1): no KL is subtracted.
    """
    if coef == 0 or not roles:
        return dict(rewards)
    objects = role_reward_objects(cfg or RewardConfig())
    out = dict(rewards)
    for role in roles:
        calls = [c for c in record.calls_of(role) if c.call_id in rewards]
        missing = [c.call_id for c in calls if c.call_id not in kl_sums]
        if missing:
            raise ValueError(f"KL in reward for role {role!r} needs old and reference log-probs of calls {missing} "
                             f"(question {record.question_id}); compute them before the rewards")
        if role_of(role).grouping == "request":
            for c in calls:
                if not objects[role].invalid(c):
                    out[c.call_id] = rewards[c.call_id] - coef * kl_sums[c.call_id]
        elif not any(c.invalid for c in calls):
            total = sum(kl_sums[c.call_id] for c in calls)
            for c in calls:
                out[c.call_id] = rewards[c.call_id] - coef * total
    return out
