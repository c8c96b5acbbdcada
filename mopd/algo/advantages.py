"""Advantages: role-wise GRPO, Answerer candidate groups, OPD, and the per-token assembly.

``group_normalize`` uses the *sample* standard deviation (Bessel-corrected, ddof=1), as verl's
``compute_grpo_outcome_advantage`` and TRL's GRPO trainer do, so numbers match what users of
those trainers expect. A group of one, or a group whose rewards are all equal, gets advantage 0.

Groups (Dr. MAS role-wise normalisation, docs/method.md), keyed by the sampled prompt
(``WorkflowRecord.group_id``, verl's uid), not by the question id; each role's ``grouping`` in the
role table (``mopd.core.roles``) says which:
- ``trajectory`` roles (Leader, Searchers with a trajectory-level reward): one value per
  trajectory, normalised over the G trajectories of the same prompt; every call of the role in a
  trajectory takes it.
- Searchers with per-call rewards (the prompted critic): normalised over all Searcher calls of the
  prompt's G trajectories.
- ``request`` roles (the Answerer): over the calls of one request (``AgentCall.group``: the
  candidates of one answering request).
- OPD roles take no outcome advantage: the loss forms theirs per token from the teacher
  (``mopd_kernels.terms.token_advantages``, the one place that formula is written).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Dict, Hashable, List, Optional, Sequence, Tuple

import torch

from mopd.algo.rewards import kl_in_reward, role_reward_objects, role_rewards
from mopd.config import AlgoConfig, Config
from mopd.core.records import AgentCall, WorkflowRecord
from mopd.core.roles import role as role_of
from mopd.core.roles import role_id, role_names


def group_normalize(rewards: torch.Tensor, group_ids: Sequence[Hashable] | torch.Tensor,
                    eps: float = 1e-6) -> torch.Tensor:
    """``(r - mean_g) / (std_g + eps)`` per group, std with ddof=1; singletons and ties give 0."""
    r = torch.as_tensor(rewards, dtype=torch.float64).flatten()
    if isinstance(group_ids, torch.Tensor):
        keys = group_ids.tolist()
    else:
        keys = list(group_ids)
    if len(keys) != r.numel():
        raise ValueError(f"rewards has {r.numel()} entries but group_ids has {len(keys)}")
    index: Dict[Hashable, int] = {}
    gid = torch.tensor([index.setdefault(k, len(index)) for k in keys], dtype=torch.long)
    n = len(index)
    count = torch.zeros(n, dtype=torch.float64).index_add_(0, gid, torch.ones_like(r))
    mean = torch.zeros(n, dtype=torch.float64).index_add_(0, gid, r) / count
    dev = r - mean[gid]
    ss = torch.zeros(n, dtype=torch.float64).index_add_(0, gid, dev * dev)
    std = torch.sqrt(ss / (count - 1).clamp(min=1))
    adv = dev / (std[gid] + eps)
    # Exact zeros where the group cannot rank anything (one member, or all equal).
    flat = (count[gid] < 2) | (std[gid] == 0)
    adv = torch.where(flat, torch.zeros_like(adv), adv)
    return adv.to(torch.float32)


def group_key(record: WorkflowRecord) -> str:
    """The group a record is normalised in: its sampled prompt's id (two copies of one question in
    a step are two groups), or its question for records without one."""
    return record.group_id or f"{record.dataset}/{record.question_id}"


def role_advantages(records: Sequence[WorkflowRecord], rewards: Sequence[Dict[str, float]],
                    per_call_roles: Sequence[str] = (), eps: float = 1e-6) -> List[Dict[str, float]]:
    """Advantage of every rewarded call, per record (same shape as ``rewards``).

    ``rewards[i]`` maps call ids of ``records[i]`` to their (KL-adjusted) reward; calls without a
    reward (OPD Searchers) get no advantage. ``per_call_roles`` lists the trajectory roles whose
    rewards differ per call (``searcher`` under the critic); ``request`` roles are always per call.
    """
    if len(records) != len(rewards):
        raise ValueError(f"{len(records)} records but {len(rewards)} reward maps")
    units: List[Tuple[Hashable, float, List[Tuple[int, str]]]] = []
    for i, (rec, rw) in enumerate(zip(records, rewards)):
        by_role: Dict[str, List[AgentCall]] = defaultdict(list)
        for call in rec.calls:
            if call.call_id in rw:
                by_role[call.role].append(call)
        for role, calls in by_role.items():
            if role_of(role).grouping == "request":
                for c in calls:
                    units.append(((role, group_key(rec), rec.attempt, c.group), rw[c.call_id], [(i, c.call_id)]))
            elif role in per_call_roles:
                for c in calls:
                    units.append(((role, group_key(rec)), rw[c.call_id], [(i, c.call_id)]))
            else:
                values = {rw[c.call_id] for c in calls}
                if len(values) != 1:
                    raise ValueError(f"{role} calls of {rec.question_id} attempt {rec.attempt} carry different "
                                     f"rewards {sorted(values)}; a trajectory-level role needs one reward")
                units.append(((role, group_key(rec)), values.pop(), [(i, c.call_id) for c in calls]))
    out: List[Dict[str, float]] = [dict() for _ in records]
    if not units:
        return out
    adv = group_normalize(torch.tensor([u[1] for u in units]), [u[0] for u in units], eps)
    for a, (_, _, members) in zip(adv.tolist(), units):
        for i, cid in members:
            out[i][cid] = a
    return out


def step_advantages(cfg: Config, records: Sequence[WorkflowRecord],
                    kl_sums: Optional[Dict[Tuple[int, str], float]] = None,
                    judge: Optional[Dict[Tuple[int, str], float]] = None
                    ) -> Tuple[List[Dict[str, float]], List[Dict[str, float]]]:
    """Role rewards (after KL in reward) and advantages of every rewarded call, per record.

    ``kl_sums[(i, call_id)]`` is the call's ``sum_t (log pi_old - log pi_ref)`` over its trained
    tokens (needed when ``cfg.reward.kl_coef > 0``); ``judge[(i, call_id)]`` the critic's 0/1
    verdict of a call (needed by a role whose reward is the critic's; such a trajectory role's
    rewards differ per call and are therefore normalised per call).
    """
    by_record: Dict[int, Dict[str, Dict[str, float]]] = defaultdict(lambda: {"kl": {}, "judge": {}})
    for name, table in (("kl", kl_sums or {}), ("judge", judge or {})):
        for (i, cid), v in table.items():
            by_record[i][name][cid] = v
    use_kl = cfg.reward.kl_coef > 0 and bool(cfg.reward.kl_roles)
    if use_kl and kl_sums is None:
        raise ValueError(f"KL in reward for {cfg.reward.kl_roles} needs the reference's log-probs")
    rewards: List[Dict[str, float]] = []
    for i, rec in enumerate(records):
        r = role_rewards(rec, cfg.reward, by_record[i]["judge"] if judge is not None else None)
        if use_kl:
            r = kl_in_reward(r, rec, by_record[i]["kl"], cfg.reward.kl_roles, cfg.reward.kl_coef, cfg.reward)
        rewards.append(r)
    per_call = tuple(name for name, reward in role_reward_objects(cfg.reward).items() if reward.per_call)
    return rewards, role_advantages(records, rewards, per_call_roles=per_call, eps=cfg.algo.adv_eps)


def role_specs(algo: AlgoConfig) -> list:
    """The fused loss's role specs, in role-id order, each labelled with its role's name (a role the
    config does not name takes ``role_loss()``: GRPO on its outcome reward)."""
    return [dataclasses.replace(algo.role(r), name=r) for r in role_names()]


def call_token_signals(call: AgentCall, advantage: float | None) -> Tuple[List[int], List[float]]:
    """Per-token role id and advantage of one call: the role on model-written tokens, -1 elsewhere.

    Outcome roles carry their call advantage on every model token; OPD roles (advantage None)
    carry 0 there, and the loss forms their advantage from the teacher
    (``mopd_kernels.terms.token_advantages``). ``train.step_batches.pack_records`` packs these
    lists with advantage None (0 everywhere) and writes each call's advantage on the same
    positions once the step's advantages are known.
    """
    rid = role_id(call.role)
    a = 0.0 if advantage is None else float(advantage)
    roles: List[int] = []
    advs: List[float] = []
    for seg in call.segments:
        n = len(seg.token_ids)
        if seg.trainable:
            roles.extend([rid] * n)
            advs.extend([a] * n)
        else:
            roles.extend([-1] * n)
            advs.extend([0.0] * n)
    return roles, advs
