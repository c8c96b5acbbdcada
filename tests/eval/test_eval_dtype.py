"""Evaluation precision: float16 on GPU as the paper's vLLM evaluation, training stays bf16/fp32."""

import pytest
import torch

from mopd.config import ConfigError, EvalConfig, resolve


def test_float16_is_a_model_dtype_but_not_a_training_one(tmp_path):
    cfg = resolve("cmas_rl", ["model.dtype=float16", "model.path=m", "data.train=t"])
    assert cfg.model.dtype == "float16"
    with pytest.raises(ConfigError, match="float16 cannot train"):
        cfg.check_trainable()
    with pytest.raises(ConfigError, match="eval.dtype"):
        resolve("cmas_rl", ["eval.dtype=float8"])


def test_evaluation_engines_default_to_float16_on_gpu(monkeypatch):
    from mopd.rollout.engines import evaluation_dtype

    assert EvalConfig().engine_dtype(cuda=True) == "float16"
    assert EvalConfig().engine_dtype(cuda=False) == "float32"
    assert EvalConfig(dtype="bfloat16").engine_dtype(cuda=True) == "bfloat16"
    cfg = resolve("hmas_base")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert evaluation_dtype(cfg.rollout, cfg.eval) == "float32"
    # vLLM's CPU build runs on a machine without CUDA too, where float16 is no evaluation precision
    assert evaluation_dtype(resolve("hmas_base", ["rollout.engine=vllm"]).rollout, cfg.eval) == "float32"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert evaluation_dtype(cfg.rollout, cfg.eval) == "float16"
    assert evaluation_dtype(resolve("hmas_base", ["rollout.engine=vllm"]).rollout, cfg.eval) == "float16"
    # training precision is unchanged: bf16 on CUDA
    from mopd.train.model import resolve_dtype

    assert resolve_dtype(resolve("mopd").model.dtype, torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("float16", torch.device("cpu")) == torch.float16


def test_hf_engine_loads_float16_weights(tmp_path):
    from tests.helpers.tiny_model import init_tiny_model
    from mopd.rollout.hf_engine import HFEngine

    path = init_tiny_model(tmp_path / "m", vocab_size=300, hidden=16, layers=1, heads=2, ffn=32)
    engine = HFEngine.from_pretrained(str(path), dtype="float16", device="cpu")
    assert {p.dtype for p in engine.model.parameters()} == {torch.float16}
