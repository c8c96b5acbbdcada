"""The paper's method presets: functions returning a :class:`~mopd.config.Config`, registered under
their own names (torchtitan's config registry). Any module can add one the same way::

    from mopd.config import Config, register_preset

    @register_preset
    def my_method() -> Config: ...

The presets follow the paper; every place where they depart from it is listed, with its reason, in
``docs/method.md``.
"""

from __future__ import annotations

from mopd.config.method import RewardConfig, TeacherConfig, role_loss
from mopd.config.registries import register_preset
from mopd.config.rollout import RolloutConfig
from mopd.config.run import Config
from mopd.core.workflows import workflow
from mopd_kernels.role_spec import RoleSpec


def _stage2_base(method: str, description: str, searcher: RoleSpec, searcher_reward: str,
                 teacher_path: str = "") -> Config:
    """H-MAS with outcome RL for Leader and Answerer (R - KL in reward), the Searcher as given."""
    cfg = Config(
        method=method,
        description=description,
        rollout=RolloutConfig(workflow="hmas", max_steps=workflow("hmas").max_steps, max_rounds=5),
        reward=RewardConfig(kl_coef=1e-3, kl_roles=["leader", "answerer"]),
        teacher=TeacherConfig(path=teacher_path),
    )
    cfg.reward.roles.update(searcher=searcher_reward, leader="team_assign")
    cfg.algo.roles["searcher"] = searcher
    return cfg


@register_preset
def cmas_rl() -> Config:
    """Stage I: Searcher -> Answerer cascade, GRPO on R_S (Searcher) and R_A (Answerer)."""
    return Config(
        method="cmas_rl",
        description="Stage I (C-MAS): role-wise GRPO on R_EM + 0.2 b_S (Searcher) and c_ij (Answerer); no teacher.",
        rollout=RolloutConfig(workflow="cmas", max_steps=workflow("cmas").max_steps),
    )


@register_preset
def mopd() -> Config:
    """Stage II: the paper's method, OPD from the Stage-I teacher on every Searcher token."""
    return _stage2_base(
        "mopd",
        "Stage II (H-MAS), MultiAgent-OPD: GRPO on R_EM + 0.2 R_assign - KL (Leader), c_ij - KL "
        "(Answerer), per-token OPD from the Stage-I teacher (Searcher). Set teacher.path.",
        role_loss(advantage="opd"), "none")


@register_preset
def outcome_searcher() -> Config:
    """Ablation: Searchers trained with GRPO on the team outcome instead of OPD."""
    c = _stage2_base("outcome_searcher",
                     "Ablation: H-MAS with Searchers on GRPO over R_EM (no teacher for the Searcher); "
                     "KL in reward still needs the Stage-I model (teacher.path or reference.path).",
                     role_loss(advantage="outcome"), "team")
    return c


@register_preset
def base_teacher() -> Config:
    """Ablation: OPD from the untrained base model pi_0 instead of the Stage-I teacher; the Leader
    and Answerer keep the Stage-I model as KL reference (the paper: all variants retain the Leader
    and Answerer objectives)."""
    cfg = _stage2_base("base_teacher",
                       "Ablation: Searcher OPD from pi_0 (teacher.path = model.path) instead of Stage I; the "
                       "Leader/Answerer KL reference stays the Stage-I model (set reference.path).",
                       role_loss(advantage="opd"), "none")
    cfg.reference.from_teacher = False
    return cfg


@register_preset
def no_searcher_supervision() -> Config:
    """Ablation: Searcher policy, entropy and KL terms are 0; its tokens stay in the denominator."""
    return _stage2_base(
        "no_searcher_supervision",
        "Ablation: no Searcher learning signal (pg, entropy, KL coefficients 0); its tokens still "
        "count in the loss denominator. Teacher = Stage I (for Leader/Answerer KL in reward).",
        role_loss(advantage="outcome", pg_coef=0.0, entropy_coef=0.0, kl_coef=0.0), "none")


@register_preset
def prompted_critic() -> Config:
    """Baseline: Searchers on GRPO over 0.3 R_EM + 0.5 R_judge + 0.2 b_S (judge = current policy)."""
    return _stage2_base(
        "prompted_critic",
        "Baseline: H-MAS with Searchers on GRPO over 0.3 R_EM + 0.5 R_judge + 0.2 b_S, R_judge a "
        "binary verdict of the current policy on the judge prompt.",
        role_loss(advantage="outcome"), "critic")


@register_preset
def cmas_base() -> Config:
    """Untrained C-MAS baseline (evaluation only)."""
    return Config(method="cmas_base", description="Untrained pi_0 in the C-MAS workflow (evaluation only).",
                  rollout=RolloutConfig(workflow="cmas", max_steps=workflow("cmas").max_steps))


@register_preset
def hmas_base() -> Config:
    """Untrained H-MAS baseline (evaluation only)."""
    return Config(method="hmas_base", description="Untrained pi_0 in the H-MAS workflow (evaluation only).",
                  rollout=RolloutConfig(workflow="hmas", max_steps=workflow("hmas").max_steps, max_rounds=5))
