"""VLLMEngine with LoRA adapters on the real vLLM engine (CPU build): it generates with the base
model until ``load_adapter``, then with the PEFT adapter it was given, token for token as the HF
engine does over the same base with the same adapter injected by PEFT; a second adapter replaces
the first (no stale cache), on ``generate`` and on the step front alike."""

import random

import pytest
import torch

from tests.helpers.vllm import require_vllm

require_vllm()

from mopd.config import RolloutConfig  # noqa: E402
from mopd.core.generation import GenerationRequest, SamplingParams  # noqa: E402
from mopd.rollout.engine import capabilities_of  # noqa: E402
from mopd.rollout.engines import build_engine  # noqa: E402
from mopd.rollout.hf_engine import HFEngine  # noqa: E402
from mopd.rollout.vllm_async_engine import VLLMStepFront  # noqa: E402
from mopd.rollout.vllm_engine import VLLM_LORA_RANKS, vllm_lora_ranks  # noqa: E402
from tests.vllm.conftest import MAX_INPUT, MAX_OUTPUT  # noqa: E402

LORA_RANK = 12
"""Not one of vLLM's ranks: the engine reserves slots of rank 16, the smallest that holds it."""
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
HANG_GUARD_S = 300


def write_adapter(base_dir, out_dir, *, seed, rank=LORA_RANK, alpha=20, targets=TARGETS):
    """A PEFT LoRA adapter over the model in ``base_dir``, as ``save_pretrained`` writes it, with
    random (non-zero) A and B so that it changes the model's output."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets),
                                                  lora_dropout=0.0, init_lora_weights=False))
    peft_model.save_pretrained(out_dir)
    return str(out_dir)


def hf_with_adapter(base_dir, adapter_dir):
    """The HF engine over the base with ``adapter_dir`` injected by PEFT (float32, no prefix cache)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(model, adapter_dir).eval()
    return HFEngine(model, AutoTokenizer.from_pretrained(base_dir), prefix_cache_mb=0)


def greedy_requests(n, seed, new_tokens=16):
    rng = random.Random(seed)
    return [GenerationRequest([rng.randrange(5, 700) for _ in range(rng.randint(3, 40))],
                              SamplingParams(temperature=0.0, max_new_tokens=new_tokens)) for _ in range(n)]


def tokens(outputs):
    return [o[0].token_ids for o in outputs]


@pytest.fixture(scope="module")
def adapters(vllm_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return [write_adapter(vllm_model_dir, root / f"a{i}", seed=10 + i, alpha=[24, 36][i]) for i in range(2)]


BASE_REQUESTS = greedy_requests(6, seed=1)


@pytest.fixture(scope="module")
def started(vllm_model_dir):
    """The engine as ``rollout.engine=vllm`` builds it for ``model.lora.rank=12``, and its greedy
    tokens for :data:`BASE_REQUESTS` right after start, before any adapter."""
    cfg = RolloutConfig(engine="vllm", max_input_tokens=MAX_INPUT, max_output_tokens=MAX_OUTPUT, seed=5)
    engine = build_engine(cfg, vllm_model_dir, lora_rank=LORA_RANK)
    assert engine.lora_request is None
    yield engine, tokens(engine.generate(BASE_REQUESTS))
    engine.close()


@pytest.fixture
def lora_engine(started):
    return started[0]


def test_the_engine_reserves_one_adapter_of_the_smallest_vllm_rank_that_holds_the_trainers(lora_engine):
    config = lora_engine.llm.llm_engine.vllm_config.lora_config
    assert config is not None and config.max_loras == 1 and config.max_lora_rank == 16
    assert capabilities_of(lora_engine).loads_adapters
    assert vllm_lora_ranks() == VLLM_LORA_RANKS          # the constant is the installed vLLM's list


def test_greedy_output_is_the_base_models_until_an_adapter_is_loaded_then_the_hf_engines_with_it(
        started, hf_reference, vllm_model_dir, adapters):
    lora_engine, at_start = started
    reqs = BASE_REQUESTS
    base = tokens(hf_reference.generate(reqs))
    assert at_start == base                              # no adapter yet: the base model
    outputs = []
    for adapter in adapters:
        lora_engine.load_adapter(adapter)
        ours = tokens(lora_engine.generate(reqs))
        assert ours == tokens(hf_with_adapter(vllm_model_dir, adapter).generate(reqs))
        outputs.append(ours)
    assert outputs[0] != base and outputs[1] != base and outputs[0] != outputs[1]   # each adapter tells
    assert lora_engine.llm.llm_engine.list_loras() == {lora_engine.lora_request.lora_int_id}
    lora_engine.load_adapter(adapters[0])                # the first again, under a new id: not a cached one
    assert tokens(lora_engine.generate(reqs)) == outputs[0]


def test_the_step_front_generates_with_the_adapter_loaded_before_the_rollout(lora_engine, vllm_model_dir, adapters):
    reqs = greedy_requests(5, seed=2, new_tokens=12)
    for adapter in reversed(adapters):
        lora_engine.load_adapter(adapter)
        front = VLLMStepFront(lora_engine)
        try:
            got = [f.result(timeout=HANG_GUARD_S) for f in [front.submit(r) for r in reqs]]
        finally:
            front.close()
        assert tokens(got) == tokens(hf_with_adapter(vllm_model_dir, adapter).generate(reqs))


def test_an_adapter_vllm_cannot_serve_fails_in_load_adapter_and_the_previous_one_stays(
        lora_engine, vllm_model_dir, adapters, tmp_path):
    too_wide = write_adapter(vllm_model_dir, tmp_path / "wide", seed=3, rank=32)   # above the slots' rank 16
    lora_engine.load_adapter(adapters[1])
    reqs = greedy_requests(3, seed=3)
    before = tokens(lora_engine.generate(reqs))
    kept = lora_engine.lora_request
    with pytest.raises(Exception, match="rank"):
        lora_engine.load_adapter(too_wide)
    assert lora_engine.lora_request == kept
    assert tokens(lora_engine.generate(reqs)) == before
