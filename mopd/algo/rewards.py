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

from typing import Dict, List, Optional, Sequence

from mopd.config import RewardConfig
from mopd.core.records import AgentCall, WorkflowRecord
from mopd.core.roles import BUILTIN_ROLES, role_names
from mopd.core.roles import role as role_of
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


def role_rewards(record: WorkflowRecord, cfg: RewardConfig,
                 judge: Optional[Dict[str, float]] = None) -> Dict[str, float]:
    """Reward of every call of the workflow, keyed by call_id (before KL and normalisation).

    ``judge`` maps Searcher call ids to the critic's 0/1 verdict (needed when cfg.searcher=critic).
    Searcher calls get no entry when cfg.searcher == "none" (their signal is OPD or nothing).
    """
    r_em = team_outcome(candidate_scores(record))
    out: Dict[str, float] = {}

    for call in record.calls_of("answerer"):
        out[call.call_id] = cfg.invalid_reward if answerer_invalid(call) else candidate_score(call, record.answers)

    leaders = record.calls_of("leader")
    if leaders:
        if cfg.leader == "team_assign":
            r_l = r_em + cfg.assign_coef * assignment_reward(search_steps(record), cfg.assign_cap)
        else:
            r_l = r_em
        if any(c.invalid for c in leaders):
            r_l = cfg.invalid_reward
        for c in leaders:
            out[c.call_id] = r_l

    searchers = record.calls_of("searcher")
    if searchers and cfg.searcher != "none":
        if cfg.searcher == "critic":
            if judge is None:
                raise ValueError("reward.searcher=critic needs the judge verdicts of the Searcher reports")
            for c in searchers:
                if c.call_id not in judge:
                    raise ValueError(f"no judge verdict for Searcher call {c.call_id} of {record.question_id}")
                r = (cfg.critic_em * r_em + cfg.critic_judge * judge[c.call_id]
                     + cfg.critic_bonus * behaviour_bonus(record, c.call_id))
                out[c.call_id] = cfg.invalid_reward if c.invalid else r
        else:
            if cfg.searcher == "team_bonus":
                r_s = r_em + cfg.bonus_coef * behaviour_bonus(record)
            else:
                r_s = r_em
            if any(c.invalid for c in searchers):
                r_s = cfg.invalid_reward
            for c in searchers:
                out[c.call_id] = r_s

    for name in role_names():
        if name not in BUILTIN_ROLES:
            out.update(_added_role_rewards(record, name, r_em, cfg.invalid_reward))
    return out


def _added_role_rewards(record: WorkflowRecord, name: str, r_em: float, invalid_reward: float) -> Dict[str, float]:
    """A role added to the table learns from the outcome by default: a ``request`` role's calls
    from their own answers' EM (like Answerer candidates), a ``trajectory`` role's from the team
    outcome R_EM; an invalid output gets ``invalid_reward``."""
    calls = record.calls_of(name)
    if role_of(name).grouping == "request":
        return {c.call_id: invalid_reward if c.invalid else candidate_score(c, record.answers) for c in calls}
    r = invalid_reward if any(c.invalid for c in calls) else r_em
    return {c.call_id: r for c in calls}


def kl_in_reward(rewards: Dict[str, float], record: WorkflowRecord, kl_sums: Dict[str, float],
                 roles: Sequence[str], coef: float) -> Dict[str, float]:
    """Subtract ``coef * sum_t (old_logp - ref_logp)`` (k1, verl's apply_kl_penalty) per role, toward
    the KL reference (the Stage-I policy; the OPD teacher unless ``reference.path`` names another).

    ``kl_sums[call_id]`` is the sum over the call's model tokens. For a trajectory-level role
    (the Leader) the sum runs over all of the role's calls in the workflow, so every call keeps
    the same reward; Answerer candidates are penalised by their own tokens. An invalid output's
    reward stays exactly ``invalid_reward`` (the paper's total reward of -1): no KL is subtracted.
    """
    if coef == 0 or not roles:
        return dict(rewards)
    out = dict(rewards)
    for role in roles:
        calls = [c for c in record.calls_of(role) if c.call_id in rewards]
        missing = [c.call_id for c in calls if c.call_id not in kl_sums]
        if missing:
            raise ValueError(f"KL in reward for role {role!r} needs old and reference log-probs of calls {missing} "
                             f"(question {record.question_id}); compute them before the rewards")
        if role_of(role).grouping == "request":
            for c in calls:
                if not (answerer_invalid(c) if role == "answerer" else c.invalid):
                    out[c.call_id] = rewards[c.call_id] - coef * kl_sums[c.call_id]
        elif not any(c.invalid for c in calls):
            total = sum(kl_sums[c.call_id] for c in calls)
            for c in calls:
                out[c.call_id] = rewards[c.call_id] - coef * total
    return out
