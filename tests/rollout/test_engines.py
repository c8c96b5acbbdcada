"""build_engine: the engine a config names, and the LoRA rank passed on only to builders that take it."""

import random

import pytest

from mopd.config import ENGINES, ConfigError, RolloutConfig
from mopd.rollout.engines import accepts_keyword, build_engine


@pytest.fixture
def engine_names():
    """Registers test builders under unique names; unregistered after the test."""
    names = []

    def register(builder):
        names.append(f"lora_test_{random.randrange(10**9)}")
        ENGINES.register(names[-1], builder)
        return names[-1]

    yield register
    for name in names:
        ENGINES.unregister(name)


def test_a_builder_without_lora_rank_keeps_working_for_full_fine_tuning_and_is_refused_with_lora(engine_names):
    calls = []

    def plain(rollout_cfg, model_path, *, dtype, device, trainer_model):
        calls.append((model_path, dtype, device, trainer_model))
        return "plain engine"

    cfg = RolloutConfig(engine=engine_names(plain))
    assert build_engine(cfg, "/m", dtype="float32", device="cpu", trainer_model=None) == "plain engine"
    assert build_engine(cfg, "/m", lora_rank=0) == "plain engine"
    assert calls == [("/m", "float32", "cpu", None), ("/m", "auto", None, None)]
    with pytest.raises(ConfigError) as e:
        build_engine(cfg, "/m", lora_rank=random.randint(1, 64))
    assert f"rollout.engine={cfg.engine} cannot generate with LoRA adapters" in str(e.value)
    assert "\n" not in str(e.value) and len(calls) == 2          # refused before the builder runs


@pytest.mark.parametrize("style", ["named", "var_keyword"])
def test_the_rank_reaches_a_builder_that_takes_it_only_when_positive(engine_names, style):
    seen = []
    if style == "named":
        def builder(rollout_cfg, model_path, *, dtype, device, trainer_model, lora_rank=0):
            seen.append(lora_rank)
    else:
        def builder(rollout_cfg, model_path, **kwargs):
            seen.append(kwargs.get("lora_rank", "absent"))
    cfg = RolloutConfig(engine=engine_names(builder))
    rank = random.randint(1, 300)
    build_engine(cfg, "/m", lora_rank=rank)
    build_engine(cfg, "/m")
    assert seen == [rank, 0 if style == "named" else "absent"]


def test_accepts_keyword_reads_the_signature():
    def positional_only(a, lora_rank, /):
        pass

    assert accepts_keyword(lambda *, lora_rank: None, "lora_rank")
    assert accepts_keyword(lambda **kw: None, "lora_rank")
    assert not accepts_keyword(lambda a, b=1: None, "lora_rank")
    assert not accepts_keyword(positional_only, "lora_rank")


def test_the_hf_engine_shares_the_trainers_module_with_or_without_lora(tiny_dir, tokenizer):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    engine = build_engine(RolloutConfig(engine="hf"), "", trainer_model=(model, tokenizer), lora_rank=8)
    assert engine.model is model and engine.capabilities.shares_trainer_model
    assert not engine.capabilities.loads_adapters
