"""Fixtures of the tests on the real vLLM engine: one tiny model, one tiny world, one engine.

Engine start is the expensive part (about 10 s each with the CPU defaults on a 2-core box, the
imports once more), so the engine-level tests share ``vllm_engine``; tests that change the
weights or drive the command line build their own.
"""

import pytest

from tests.helpers.vllm import peaked_tiny_model, require_vllm

MAX_INPUT = 1800
MAX_OUTPUT = 48


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory):
    require_vllm()
    return peaked_tiny_model(tmp_path_factory.mktemp("vllm_model") / "model", max_positions=4096)


@pytest.fixture(scope="session")
def vllm_engine(vllm_model_dir):
    """The engine exactly as ``rollout.engine=vllm`` builds it (``build_engine``), CPU defaults only."""
    require_vllm()
    from mopd.config import RolloutConfig
    from mopd.rollout.engines import build_engine

    return build_engine(RolloutConfig(engine="vllm", max_input_tokens=MAX_INPUT, max_output_tokens=MAX_OUTPUT,
                                      seed=5), vllm_model_dir)


@pytest.fixture(scope="session")
def hf_reference(vllm_model_dir):
    """The same model in the HF engine (float32): the reference for tokens and log-probs."""
    from mopd.rollout.hf_engine import HFEngine

    return HFEngine.from_pretrained(vllm_model_dir, device="cpu", prefix_cache_mb=0)


@pytest.fixture(scope="session")
def quick_world(tmp_path_factory):
    """A small search-QA world with a BM25 index (tests.helpers.qa_world: seconds to build, no encoder)."""
    require_vllm()
    from tests.helpers.qa_world import build_qa_world

    return build_qa_world(tmp_path_factory.mktemp("world") / "w")
