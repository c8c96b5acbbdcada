"""Nested, typed run configuration, the named method presets, and their resolution.

A run is described by one :class:`Config`. Presets are plain Python functions that return a
``Config``, registered under their own names (as torchtitan's config registry); any field can then
be overridden by a dotted key (``trainer.lr=2e-6`` or ``--trainer.lr 2e-6``), and a whole config can
be loaded from YAML. Typing and unknown keys are checked by OmegaConf's structured configs; the
ranges and the cross-field rules are checked in each dataclass's ``__post_init__``.

Modules (import from this package; each is short enough to read at one sitting):

- :mod:`~mopd.config.checks`: ``ConfigError`` and the checks every config dataclass runs (the
  pipeline's too);
- :mod:`~mopd.config.registries`: the names a config may choose (engines, rewards, presets), each
  registered by the code that implements it, and why the registries are always full;
- the schema, one section per topic: :mod:`~mopd.config.inputs` (model, data, retriever),
  :mod:`~mopd.config.rollout`, :mod:`~mopd.config.method` (rewards, loss terms, teacher, reference),
  :mod:`~mopd.config.training` (trainer, eval), and :mod:`~mopd.config.run` (the whole ``Config``,
  its summary, and :func:`resolve`);
- :mod:`~mopd.config.resolver`: preset -> YAML -> dotted overrides and their error messages, shared
  with the pipeline's config (:mod:`mopd.pipeline.presets`);
- :mod:`~mopd.config.presets`: the paper's presets.

The presets follow the paper; every place where they (or a recipe's presets) depart from it is
listed, with its reason, in ``docs/method.md``.
"""

from mopd.config.checks import ConfigError
from mopd.config.inputs import ATTN_IMPLEMENTATIONS, DTYPES, DataConfig, ModelConfig, RetrieverConfig
from mopd.config.method import (ENTROPY_COEF, AlgoConfig, ReferenceConfig, RewardConfig, TeacherConfig,
                                role_loss)
from mopd.config.registries import (ENGINES, PRESETS, REWARDS, get_preset, preset_names, register_engine,
                                    register_preset, register_reward)
from mopd.config.resolver import ConfigKind, normalize_overrides, omegaconf_errors
from mopd.config.rollout import (DEFAULT_GPU_MEMORY_UTILIZATION, MEMORY_HEADROOM_GIB, SCHEDULERS, RolloutConfig,
                                 free_memory_share)
from mopd.config.run import (OPEN_MAPS, ROLE_SECTIONS, ROLLOUT_LOGPROBS_BF16, Config, describe, resolve, role_key,
                             identity_dict, identity_yaml, to_dict, to_yaml)
from mopd.config.training import EvalConfig, TrainerConfig
from mopd.config import presets  # noqa: F401  (registers the paper's presets)

__all__ = [
    "ATTN_IMPLEMENTATIONS", "DEFAULT_GPU_MEMORY_UTILIZATION", "DTYPES", "ENGINES", "ENTROPY_COEF",
    "MEMORY_HEADROOM_GIB", "OPEN_MAPS", "PRESETS", "REWARDS", "ROLE_SECTIONS", "ROLLOUT_LOGPROBS_BF16",
    "SCHEDULERS", "AlgoConfig", "Config", "ConfigError", "ConfigKind", "DataConfig", "EvalConfig", "ModelConfig",
    "ReferenceConfig", "RetrieverConfig", "RewardConfig", "RolloutConfig", "TeacherConfig", "TrainerConfig",
    "describe", "free_memory_share", "get_preset", "normalize_overrides", "omegaconf_errors", "preset_names",
    "register_engine", "register_preset", "register_reward", "resolve", "role_key", "role_loss", "to_dict",
    "to_yaml", "identity_dict", "identity_yaml",
]
