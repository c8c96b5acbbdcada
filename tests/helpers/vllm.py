"""What the tests on the real vLLM engine (tests/vllm/, run by `make test-vllm`) share.

They need vLLM, which the default environment (`make setup`) does not install: there they are
skipped, with the reason. `make test-vllm` sets ``MOPD_REQUIRE_VLLM=1``, and then a missing vLLM is
a failure, never a skip: CI cannot pass by not running them.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

REQUIRE_ENV = "MOPD_REQUIRE_VLLM"
"""Set to 1 (as `make test-vllm` does) to make a missing vLLM fail the tests instead of skipping them."""

SKIP_REASON = "vllm is not installed (the default set-up has none; `make test-vllm` runs these on the CPU build)"


def require_vllm():
    """vLLM, imported; or a module-level skip (a failure under ``MOPD_REQUIRE_VLLM=1``) when it is
    not installed. An installed vLLM that fails to import is an error either way."""
    if importlib.util.find_spec("vllm") is None:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but vllm is not importable here: run `make test-vllm`", pytrace=False)
        pytest.skip(SKIP_REASON, allow_module_level=True)
    import vllm

    return vllm


def sleep_mode_available() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_sleep_mode_available())


SLEEP_SKIP_REASON = ("vLLM's CPU platform has no sleep mode (current_platform.is_sleep_mode_available() is "
                     "False); the sleep/wake contract stays covered by tests/rollout/test_vllm_colocation.py's "
                     "recording fake and by bench/gpu_check.sh on a GPU")


def peaked_tiny_model(out_dir, *, scale: float = 6.0, **spec):
    """A random tiny Qwen3 model whose next-token distributions are peaked: the tied embedding is
    scaled by ``scale`` (the final RMSNorm fixes the hidden state's size, so the logits grow by
    ``scale``). Greedy decoding of two float32 engines then agrees token for token: a random model's
    near-uniform logits leave ties that rounding decides."""
    import torch
    from transformers import AutoModelForCausalLM

    from tests.helpers.tiny_model import init_tiny_model

    path = init_tiny_model(out_dir, **spec)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(scale)
    model.save_pretrained(path)
    return str(path)
