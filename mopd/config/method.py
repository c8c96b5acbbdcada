"""The method: each role's reward, each role's loss terms, the OPD teacher and the KL reference
(sections ``reward``, ``algo``, ``teacher``, ``reference`` of :class:`mopd.config.Config`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from mopd.config.checks import ConfigError, choice, positive
from mopd.config.registries import REWARDS
from mopd.core.roles import ROLE_TABLE, role_names
from mopd_kernels.role_spec import KL_TYPES, RoleSpec

ENTROPY_COEF = 1e-3
"""The entropy bonus of every role unless a preset or override says otherwise (the paper's)."""


def role_loss(**fields) -> RoleSpec:
    """A role's loss terms (:class:`mopd_kernels.RoleSpec`, the kernels' own type) with the run
    config's default entropy bonus, ``ENTROPY_COEF``."""
    return RoleSpec(**{"entropy_coef": ENTROPY_COEF, **fields})


def _default_role_losses() -> Dict[str, RoleSpec]:
    return {name: role_loss() for name in role_names()}


def _default_role_rewards() -> Dict[str, str]:
    return {name: r.reward for name, r in ROLE_TABLE.items()}


def _known_roles(section: str, names) -> None:
    unknown = [n for n in names if n not in role_names()]
    if unknown:
        raise ConfigError(f"{section}: no role named {unknown}; roles: {list(role_names())}")


@dataclass
class RewardConfig:
    roles: Dict[str, str] = field(default_factory=_default_role_rewards)
    """Each role's reward, by role name (``reward.roles.searcher=team``; ``reward.searcher=team``
    says the same): a registered reward (:data:`mopd.config.REWARDS`, filled by
    :mod:`mopd.algo.rewards`: team, team_bonus, team_assign, candidate_em, critic, none). Defaults from the role table: Leader team_assign, Searcher
    team_bonus, Answerer candidate_em; an added role the outcome of its grouping."""
    bonus_coef: float = 0.2
    """Weight of the Searcher behaviour bonus b_S (0.5 after one search step, 1 after two or more,
    paid only when the Searcher wrote a report)."""
    assign_coef: float = 0.2
    """Weight of the Leader assignment reward R_assign."""
    assign_cap: int = 6
    """C_tool is capped at this many steps: R_assign = min(C_tool, cap) / cap."""
    invalid_reward: float = -1.0
    """Total reward of a role's output with an invalid action format, exactly (no KL subtracted)."""
    kl_coef: float = 0.0
    """KL-in-reward weight: kl_coef * sum_t kl_t over a role's tokens is subtracted from its reward
    (verl's apply_kl_penalty), towards the reference policy (``reference``)."""
    kl_type: str = "k1"
    """Estimator kl_t of the KL in the reward, one of the kernels' registered estimators
    (``mopd_kernels.kl``: k1 = old_logp - ref_logp, the paper's and verl's default; k2; k3)."""
    kl_roles: List[str] = field(default_factory=list)
    """Roles whose reward carries the KL term (Stage II: leader, answerer); ``reward.kl_coef`` > 0
    with none is refused (it would train with no KL anywhere)."""
    critic_em: float = 0.3
    """Prompted Critic: weight of R_EM in the Searcher reward."""
    critic_judge: float = 0.5
    """Prompted Critic: weight of the judge verdict."""
    critic_bonus: float = 0.2
    """Prompted Critic: weight of b_S."""

    def __post_init__(self):
        _known_roles("reward.roles", self.roles)
        for name, reward in self.roles.items():
            choice(f"reward.roles.{name}", reward, REWARDS)
        positive("reward.assign_cap", self.assign_cap)
        positive("reward.kl_coef", self.kl_coef, allow_zero=True)
        choice("reward.kl_type", self.kl_type, KL_TYPES)
        _known_roles("reward.kl_roles", self.kl_roles)
        if self.kl_coef > 0 and not self.kl_roles:
            raise ConfigError(f"reward.kl_coef={self.kl_coef!r} puts a KL in no role's reward: reward.kl_roles is "
                              f"empty; name the roles (reward.kl_roles=[leader,answerer]) or set reward.kl_coef=0")

    def of(self, role: str) -> str:
        """The reward of ``role`` (its role-table default when the config does not name it)."""
        return self.roles.get(role) or ROLE_TABLE[role].reward


@dataclass
class AlgoConfig:
    roles: Dict[str, RoleSpec] = field(default_factory=_default_role_losses)
    """Loss terms of each role's tokens, by role name (``algo.roles.searcher.opd_coef=1``;
    ``algo.searcher.opd_coef=1`` says the same): the kernels' :class:`~mopd_kernels.RoleSpec`.
    Every role of the table starts with ``role_loss()``: GRPO on its outcome reward, entropy bonus
    ``ENTROPY_COEF``."""
    clip_low: float = 0.2
    """PPO ratio clip below 1."""
    clip_high: float = 0.2
    """PPO ratio clip above 1."""
    dual_clip: Optional[float] = None
    """Dual-clip constant c > 1 for negative advantages; null disables it."""
    adv_eps: float = 1e-6
    """epsilon in (r - mean) / (std + eps)."""

    def __post_init__(self):
        positive("algo.clip_low", self.clip_low)
        positive("algo.clip_high", self.clip_high)
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ConfigError(f"algo.dual_clip={self.dual_clip} must be > 1 (or null)")
        _known_roles("algo.roles", self.roles)   # each RoleSpec checks its own fields (role_spec.spec_problem)

    def role(self, name: str) -> RoleSpec:
        """The loss terms of ``name``'s tokens (``role_loss()`` for a role the config does not name,
        e.g. one added to the role table after the config was made)."""
        choice("role", name, role_names())
        return self.roles.get(name) or role_loss()


@dataclass
class TeacherConfig:
    path: str = ""
    """Frozen OPD teacher pi_T (a Hugging Face directory): the Stage-I export, or pi_0 for
    base_teacher. Empty = no teacher. Unless ``reference.path`` names another model, it is also
    the KL reference (one model, loaded once)."""
    cpu_offload: bool = False
    """Keep the teacher's (and the reference's) sharded parameters on CPU between scoring passes."""


@dataclass
class ReferenceConfig:
    path: str = ""
    """Frozen KL reference pi_ref (a Hugging Face directory) of the KL in reward
    (``reward.kl_coef``) and of KL loss terms (``algo.<role>.kl_coef``). The paper's reference is
    the Stage-I policy. Empty: the teacher (``teacher.path``), when ``from_teacher``."""
    from_teacher: bool = True
    """With ``path`` empty, use the OPD teacher as the reference (loaded once). base_teacher sets
    false: its teacher is pi_0 while the reference stays the Stage-I model, so ``path`` must name
    the Stage-I export."""
