"""The colocation cycle on the real engine: after an optimizer step, the streamed weights make
vLLM sample what the updated Hugging Face model samples, and no longer what the old one did."""

import pytest
import torch

from tests.helpers.vllm import SLEEP_SKIP_REASON, require_vllm, sleep_mode_available

require_vllm()

from mopd.core.generation import GenerationRequest, SamplingParams  # noqa: E402
from mopd.rollout.hf_engine import HFEngine  # noqa: E402
from mopd.train.weight_sync import refresh_engine, release_engine  # noqa: E402
from tests.vllm.test_engine import LOGPROB_TOL, random_prompts  # noqa: E402


@pytest.fixture(scope="module")
def own_engine(vllm_model_dir):
    """An engine of its own: these tests change its weights."""
    from mopd.config import RolloutConfig
    from mopd.rollout.engines import build_engine

    return build_engine(RolloutConfig(engine="vllm", max_input_tokens=256, max_output_tokens=32), vllm_model_dir)


def trainer_model(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), AutoTokenizer.from_pretrained(path)


def one_update(model, seed=0, lr=3e-2):
    """One AdamW step on next-token loss over random sequences (every parameter moves by about lr)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 700, (4, 24), generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    model(ids, labels=ids).loss.backward()
    opt.step()
    model.eval()


def greedy(engine, prompts):
    return [o[0] for o in engine.generate(
        [GenerationRequest(p, SamplingParams(temperature=0.0, max_new_tokens=16)) for p in prompts])]


def test_after_an_update_the_engine_samples_the_updated_model_and_not_the_old_one(own_engine, vllm_model_dir):
    prompts = random_prompts(8, seed=21)
    model, tok = trainer_model(vllm_model_dir)
    before = greedy(own_engine, prompts)
    assert [c.token_ids for c in before] == [c.token_ids for c in greedy(HFEngine(model, tok, prefix_cache_mb=0), prompts)]

    one_update(model)
    release_engine(own_engine, model)
    refresh_engine(own_engine, model, torch.float32)
    after = greedy(own_engine, prompts)
    updated = greedy(HFEngine(model, tok, prefix_cache_mb=0), prompts)

    assert [c.token_ids for c in after] == [c.token_ids for c in updated]
    for a, u in zip(after, updated):
        assert max(abs(x - y) for x, y in zip(a.logprobs, u.logprobs)) < LOGPROB_TOL
    changed = sum(a.token_ids != b.token_ids for a, b in zip(after, before))
    assert changed >= len(prompts) // 2, f"only {changed} of {len(prompts)} greedy outputs changed"


def test_streaming_in_bfloat16_reaches_the_float32_engine_as_the_rounded_weights(own_engine, vllm_model_dir):
    """The trainer streams in its compute dtype; an engine of another dtype receives the values cast."""
    model, tok = trainer_model(vllm_model_dir)
    one_update(model, seed=1)
    refresh_engine(own_engine, model, torch.bfloat16)
    rounded, _ = trainer_model(vllm_model_dir)
    rounded.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in model.state_dict().items()})
    prompts = random_prompts(4, seed=22)
    assert [c.token_ids for c in greedy(own_engine, prompts)] == \
        [c.token_ids for c in greedy(HFEngine(rounded, tok, prefix_cache_mb=0), prompts)]


@pytest.mark.skipif(not sleep_mode_available(), reason=SLEEP_SKIP_REASON)
def test_level2_sleep_frees_device_memory_and_the_cycle_restores_the_trained_weights(own_engine, vllm_model_dir):
    model, tok = trainer_model(vllm_model_dir)
    one_update(model, seed=2)
    free_awake = torch.cuda.mem_get_info()[0]
    release_engine(own_engine, model)
    assert torch.cuda.mem_get_info()[0] > free_awake               # KV cache and weights gone
    refresh_engine(own_engine, model, own_engine.weight_dtype)
    prompts = random_prompts(4, seed=23)
    assert [c.token_ids for c in greedy(own_engine, prompts)] == \
        [c.token_ids for c in greedy(HFEngine(model.to(own_engine.weight_dtype), tok, prefix_cache_mb=0), prompts)]
