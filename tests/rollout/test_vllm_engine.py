"""VLLMEngine's engine-independent parts, in the default environment (no vLLM); tests/vllm runs the real engine."""

import importlib.util
from types import SimpleNamespace

import pytest

from mopd.config import RolloutConfig
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
