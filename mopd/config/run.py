"""The run's configuration, :class:`Config` (one section per topic, each in its own module), and how
a run's config is resolved from a preset, a YAML file and dotted overrides (:func:`resolve`, with
the resolver the pipeline's config shares, :mod:`mopd.config.resolver`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import List, Optional

from mopd.config.checks import ConfigError, finite_floats, fitting_paths
from mopd.config.inputs import DataConfig, ModelConfig, RetrieverConfig
from mopd.config.method import AlgoConfig, ReferenceConfig, RewardConfig, TeacherConfig
from mopd.config.registries import get_preset
from mopd.config.resolver import ConfigKind, resolve_layers
from mopd.config.rollout import RolloutConfig
from mopd.config.training import EvalConfig, TrainerConfig
from mopd.core.roles import role_names
from mopd.core.workflows import workflow
from mopd_kernels.role_spec import spec_problem

ROLLOUT_LOGPROBS_BF16 = (
    "trainer.old_logprobs=rollout needs float32 training: in bfloat16 the engine's cached decoding "
    "and the trainer's packed forward round differently, so pi_old would not be the trainer's; use "
    "trainer.old_logprobs=recompute (or model.dtype=float32)")
"""Why ``trainer.old_logprobs=rollout`` is refused in bf16 (explicit here, ``auto`` on CUDA in the trainer)."""


@dataclass
class Config:
    method: str = "custom"
    """Name of the preset this config came from (informational)."""
    description: str = ""
    """What the preset does, in a sentence."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy pi_0 and how it is loaded (:mod:`mopd.config.inputs`)."""
    data: DataConfig = field(default_factory=DataConfig)
    """Training and validation questions."""
    retriever: RetrieverConfig = field(default_factory=RetrieverConfig)
    """The search engine the Searchers query."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Engine, workflow, sampling and limits of training rollouts (:mod:`mopd.config.rollout`)."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Each role's reward and the KL in reward (:mod:`mopd.config.method`)."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """Each role's loss terms and the PPO clip."""
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    """The frozen OPD teacher."""
    reference: ReferenceConfig = field(default_factory=ReferenceConfig)
    """The frozen KL reference."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Steps, batches, optimiser, checkpoints, validation, logging (:mod:`mopd.config.training`)."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Sampling and bootstrap of evaluations."""

    def __post_init__(self):
        finite_floats(self)
        fitting_paths(self)
        idle = [r for r in self.opd_roles() if r not in workflow(self.rollout.workflow).roles]
        if idle:
            raise ConfigError(f"algo.roles.{idle[0]}.advantage=opd makes no sense for the {self.rollout.workflow} "
                              f"workflow (it has no {idle[0]})")
        if self.trainer.old_logprobs == "rollout":
            if self.rollout.engine != "hf":   # the early form of the trainer's check of the engine's capabilities
                raise ConfigError("trainer.old_logprobs=rollout needs rollout.engine=hf: other engines compute "
                                  "sampling log-probs differently (precision, processed logits); use recompute")
            if self.rollout.top_p < 1:
                raise ConfigError(f"trainer.old_logprobs=rollout needs rollout.top_p=1 (got {self.rollout.top_p}): "
                                  "the engine records log-probs before the nucleus cut; use recompute")
            if self.model.dtype == "bfloat16":
                raise ConfigError(ROLLOUT_LOGPROBS_BF16)

    def opd_roles(self) -> List[str]:
        """Roles that learn from the OPD teacher (``teacher.path``)."""
        return sorted(r for r in role_names() if self.algo.role(r).advantage == "opd")

    def reference_roles(self) -> List[str]:
        """Roles whose signal needs the KL reference's log-probs: KL in reward, or a KL loss term."""
        need = set(self.reward.kl_roles) if self.reward.kl_coef > 0 else set()
        return sorted(need | {r for r in role_names() if self.algo.role(r).kl_coef > 0})

    def teacher_roles(self) -> List[str]:
        """Roles that need a frozen model's log-probs: the teacher's (OPD) or the reference's (KL)."""
        return sorted(set(self.opd_roles()) | set(self.reference_roles()))

    def reference_path(self) -> str:
        """The KL reference's directory: ``reference.path``, else the teacher's (when
        ``reference.from_teacher``); empty when there is none."""
        if self.reference.path:
            return self.reference.path
        return self.teacher.path if self.reference.from_teacher else ""

    def check_trainable(self) -> None:
        """Checks that only matter when training starts (presets may leave paths empty)."""
        if not self.model.path:
            raise ConfigError("model.path is empty: set model.path=DIR (a Hugging Face model directory)")
        if not self.data.train:
            raise ConfigError("data.train is empty: set data.train=FILE (FlashRAG jsonl or Search-R1 parquet)")
        if self.model.dtype == "float16":
            raise ConfigError("model.dtype=float16 cannot train (no loss scaling): use bfloat16 (or auto); "
                              "eval.dtype sets the evaluation precision")
        opd = self.opd_roles()
        if opd and not self.teacher.path:
            raise ConfigError(f"{self.method}: roles {opd} learn by OPD and need teacher log-probs; "
                              "set teacher.path=DIR (the Stage-I export, or pi_0 for base_teacher)")
        ref = self.reference_roles()
        if ref and not self.reference_path():
            if self.reference.from_teacher:
                raise ConfigError(f"{self.method}: roles {ref} need KL-reference log-probs (KL in reward or "
                                  "a KL loss term); set teacher.path=DIR or reference.path=DIR (the Stage-I "
                                  "export)")
            raise ConfigError(f"{self.method}: roles {ref} keep the Stage-I model as their KL reference, "
                              "which is not the teacher here; set reference.path=DIR (the Stage-I export)")


OPEN_MAPS = ("model.chat_template_kwargs",)
"""Fields that take any keys (``model.chat_template_kwargs.enable_thinking=false``)."""


ROLE_SECTIONS = ("algo", "reward")
"""Sections with a per-role map under ``roles``, whose keys may also name the role directly:
``algo.searcher.opd_coef`` is ``algo.roles.searcher.opd_coef``, ``reward.searcher`` is
``reward.roles.searcher`` (on the command line and in YAML files)."""


def role_key(key: str) -> str:
    """``key`` with a role named directly under a role section moved under its ``roles`` map."""
    parts = key.split(".")
    if len(parts) >= 2 and parts[0] in ROLE_SECTIONS and parts[1] in role_names():
        return ".".join([parts[0], "roles", *parts[1:]])
    return key


def _role_keys_in_yaml(layer) -> None:
    """Move ``algo: {searcher: ...}`` / ``reward: {searcher: ...}`` under ``roles`` (as role_key)."""
    from omegaconf import DictConfig, OmegaConf, open_dict

    for section in ROLE_SECTIONS:
        node = layer.get(section) if isinstance(layer, DictConfig) else None
        if not isinstance(node, DictConfig):
            continue
        direct = [k for k in node if k in role_names()]
        if not direct:
            continue
        with open_dict(node):
            roles = node.get("roles") or OmegaConf.create({})
            for k in direct:
                roles[k] = node.pop(k)
            node["roles"] = roles


def _check_role_choices(merged) -> None:
    """Each role's RoleSpec fields, by the kernels' one check of them, run where the full key can
    still be named (RoleSpec's own run of it, when the config is built, knows only its field)."""
    for name, spec in merged.algo.roles.items():
        problem = spec_problem(spec, where=f"algo.roles.{name}.")
        if problem:
            raise ConfigError(problem)


def to_yaml(cfg: Config) -> str:
    """``cfg`` as YAML (what ``--file`` reads back)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_dict(cfg: Config) -> dict:
    """``cfg`` as nested plain dicts (run.json)."""
    return dataclasses.asdict(cfg)


def identity_dict(cfg: Config) -> dict:
    """:func:`to_dict` less the settings that are off or at the value they had before they were
    settings, which say nothing new about what a run trains: the ``model.lora`` settings when LoRA
    is off (``model.lora.rank=0``), ``reward.kl_type`` at k1 (the KL in the reward was k1 before it
    could be chosen). What a run's identity and a stage's fingerprint are made of, so that runs and
    pipelines recorded before such a setting existed still match."""
    return _leave_out_unchanged(to_dict(cfg), cfg)


def identity_yaml(cfg: Config) -> str:
    """:func:`to_yaml` less what :func:`identity_dict` leaves out."""
    from omegaconf import OmegaConf

    d = _leave_out_unchanged(OmegaConf.to_container(OmegaConf.structured(cfg)), cfg)
    return OmegaConf.to_yaml(OmegaConf.create(d))


def _leave_out_unchanged(d: dict, cfg: Config) -> dict:
    if not cfg.model.lora.enabled:
        d["model"].pop("lora")
    if cfg.reward.kl_type == "k1":
        d["reward"].pop("kl_type")
    return d


def describe(cfg: Config) -> str:
    """A short human summary of what a method does: role specs, rewards, teacher."""
    lines = [f"method: {cfg.method} ({cfg.rollout.workflow})", f"  {cfg.description}"]
    for r in workflow(cfg.rollout.workflow).roles:
        spec = cfg.algo.role(r)
        sig = (f"OPD beta={spec.opd_coef}" if spec.advantage == "opd"
               else f"GRPO on reward={cfg.reward.of(r)}")
        kl = f", KL in reward {cfg.reward.kl_coef}" if r in cfg.reward.kl_roles and cfg.reward.kl_coef else ""
        lines.append(f"  {r:9s} {sig}{kl}; pg={spec.pg_coef} entropy={spec.entropy_coef} kl_loss={spec.kl_coef}")
    lines.append(f"  teacher: {cfg.teacher.path or '(none)'}")
    lines.append(f"  KL reference: {cfg.reference_path() or '(none)'}")
    return "\n".join(lines)


RUN_CONFIG = ConfigKind(noun="config", what="config", canonical_key=role_key, canonical_yaml=_role_keys_in_yaml,
                        open_maps=OPEN_MAPS, check_merged=_check_role_choices)
"""The run config's words, aliases and extra checks for the shared resolver."""


def resolve(preset_name: Optional[str] = None, overrides: Optional[List[str]] = None,
            yaml_file: Optional[str] = None) -> Config:
    """Build the config of a run: a preset (or the defaults), then a YAML file, then overrides."""
    base = Config() if preset_name is None else get_preset(preset_name)()
    return resolve_layers(base, RUN_CONFIG, overrides, yaml_file)
