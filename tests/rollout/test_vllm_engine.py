"""VLLMEngine's engine-independent parts, in the default environment (no vLLM); tests/vllm runs the real engine."""

import importlib.util
import random
from types import SimpleNamespace

import pytest

from mopd.config import ConfigError, RolloutConfig
from mopd.rollout.engines import build_engine
from mopd.rollout.vllm_engine import INSTALL_HINT, EngineUnavailable
from mopd.rollout.vllm_outputs import completion_from_output


def test_output_conversion(tokenizer):
    ids = tokenizer.encode("<search>q</search>", add_special_tokens=False)
    out = SimpleNamespace(token_ids=tuple(ids), finish_reason="stop",
                          logprobs=[{t: SimpleNamespace(logprob=-0.5 - i), 7: SimpleNamespace(logprob=-9.0)}
                                    for i, t in enumerate(ids)])
    c = completion_from_output(out, tokenizer)
    assert c.token_ids == ids and c.logprobs == [-0.5 - i for i in range(len(ids))]
    assert c.text == "<search>q</search>" and c.finish_reason == "stop"
    with pytest.raises(RuntimeError, match="log-probs"):
        completion_from_output(SimpleNamespace(token_ids=ids, logprobs=None, finish_reason="length"), tokenizer)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_choosing_vllm_without_it_fails_at_once_with_the_install_line(tiny_dir):
    with pytest.raises(EngineUnavailable) as e:
        build_engine(RolloutConfig(engine="vllm"), str(tiny_dir))
    assert INSTALL_HINT in str(e.value) and "rollout.engine=hf" in str(e.value)


def test_lora_kwargs_reserve_one_adapter_of_the_smallest_allowed_rank_that_holds_the_trainers():
    from mopd.rollout.vllm_engine import VLLM_LORA_RANKS, lora_kwargs

    assert lora_kwargs(0) == {}                                  # full fine-tuning: vLLM as before
    rng = random.Random(0)
    for rank in [1, 2, 8, 9, 16, 17, 320, 321, 512] + [rng.randint(1, 512) for _ in range(20)]:
        kw = lora_kwargs(rank)
        assert kw["enable_lora"] is True and kw["max_loras"] == 1
        assert kw["max_lora_rank"] in VLLM_LORA_RANKS and kw["max_lora_rank"] >= rank
        assert all(r < rank for r in VLLM_LORA_RANKS if r < kw["max_lora_rank"])    # the smallest that fits
    assert lora_kwargs(5, ranks=(4, 6, 32))["max_lora_rank"] == 6              # the installed vLLM's list
    assert lora_kwargs(12)["max_lora_rank"] == 16 and lora_kwargs(321)["max_lora_rank"] == 512


def test_a_rank_above_vllms_largest_is_refused_in_one_line():
    from mopd.rollout.vllm_engine import lora_kwargs

    with pytest.raises(ConfigError) as e:
        lora_kwargs(513)
    assert "model.lora.rank=513" in str(e.value) and "512" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="model.lora.rank=33"):
        lora_kwargs(33, ranks=(8, 16, 32))
