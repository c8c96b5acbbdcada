"""The weight sync of a LoRA model (``mopd.train.weight_sync``), against recording fake engines.

An engine that loads adapters (``capabilities.loads_adapters``, vLLM built with LoRA) sleeps at
level 1 (its base kept) and receives the adapter alone, as a PEFT directory that PEFT itself loads
to the trained model's log-probs, in the order wake weights -> load_adapter -> wake kv_cache; the
bytes reported are the adapter's. An engine with its own copy that takes no adapters sleeps at level
2 and is streamed the merged weights under the plain model's Hugging Face names, which make a plain
model compute the LoRA model's log-probs."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from mopd.config.inputs import LoraConfig
from mopd.rollout.engine import EngineCapabilities
from mopd.train import lora
from mopd.train.weight_sync import ADAPTER_SLEEP_LEVEL, SLEEP_LEVEL, refresh_engine, release_engine
from tests.helpers.tiny_model import init_tiny_model

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
RANK = 4


class RecordingEngine:
    """Records the colocation calls; keeps a copy of each adapter directory it is handed (the sync
    removes the previous one) and the tensors it is streamed."""

    def __init__(self, loads_adapters: bool):
        self.capabilities = EngineCapabilities(loads_adapters=loads_adapters)
        self.calls, self.adapters, self.streamed = [], [], {}
        self._keep = tempfile.TemporaryDirectory()

    def sleep(self, level=1):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags)))

    def load_adapter(self, path):
        self.calls.append(("load_adapter",))
        copy = Path(self._keep.name) / f"a{len(self.adapters)}"
        shutil.copytree(path, copy)
        self.adapters.append(copy)

    def load_weights(self, named_tensors):
        self.calls.append(("load_weights",))
        for name, tensor in named_tensors:
            self.streamed[name] = tensor.clone()

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return init_tiny_model(tmp_path_factory.mktemp("tiny") / "model", hidden=48, layers=2, heads=2, ffn=80,
                           seed=11)


def plain(base_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()


@pytest.fixture
def trained(base_dir):
    """The base with rank-4 adapters on five projections, the adapters moved off their init (B = 0
    would make any sync look right) by two AdamW steps on random tokens."""
    torch.manual_seed(5)
    model = plain(base_dir)
    lora.add_adapters(model, LoraConfig(rank=RANK, alpha=12.0, target_modules=("q_proj", "v_proj", "o_proj",
                                                                                "up_proj", "down_proj")),
                      str(base_dir))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-2)
    g = torch.Generator().manual_seed(3)
    for _ in range(2):
        ids = torch.randint(3, model.config.vocab_size, (3, 17), generator=g)
        model(ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    return model.eval()


def logprobs(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, model.config.vocab_size, (2, 23), generator=g)
    with torch.no_grad():
        return torch.log_softmax(model(ids).logits.float(), -1)


def test_an_engine_that_loads_adapters_sleeps_at_level_1_and_gets_the_adapter_alone_in_peft_format(trained, base_dir):
    from peft import PeftModel

    engine = RecordingEngine(loads_adapters=True)
    release_engine(engine, trained)
    stats = refresh_engine(engine, trained, torch.float32)
    assert engine.calls == [("sleep", ADAPTER_SLEEP_LEVEL), ("wake_up", ("weights",)), ("load_adapter",),
                            ("wake_up", ("kv_cache",)), ("reset_prefix_cache",)]
    assert ADAPTER_SLEEP_LEVEL == 1
    assert stats.adapter and stats.as_metrics()["perf/sync_adapter_only"] == 1.0
    adapter_bytes = sum(p.numel() * p.element_size() for n, p in trained.named_parameters() if ".lora_" in n)
    assert stats.bytes == adapter_bytes                 # fp32 A and B of every adapted projection
    full_bytes = sum(p.numel() * p.element_size() for p in plain(base_dir).parameters())
    assert stats.bytes < full_bytes / 4
    loaded = PeftModel.from_pretrained(plain(base_dir), str(engine.adapters[0])).eval()
    torch.testing.assert_close(logprobs(loaded), logprobs(trained), rtol=0, atol=1e-5)
    assert not torch.allclose(logprobs(plain(base_dir)), logprobs(trained), atol=1e-3)   # the adapter tells


def test_a_second_sync_hands_over_a_fresh_directory_with_the_new_adapter(trained, base_dir):
    from peft import PeftModel

    engine = RecordingEngine(loads_adapters=True)
    refresh_engine(engine, trained, torch.float32)
    with torch.no_grad():
        for n, p in trained.named_parameters():
            if "lora_B" in n:
                p.add_(0.05 * torch.randn_like(p))
    refresh_engine(engine, trained, torch.float32)
    second = PeftModel.from_pretrained(plain(base_dir), str(engine.adapters[1])).eval()
    torch.testing.assert_close(logprobs(second, seed=1), logprobs(trained, seed=1), rtol=0, atol=1e-5)


def test_an_engine_without_adapters_sleeps_at_level_2_and_is_streamed_the_merged_plain_weights(trained, base_dir):
    engine = RecordingEngine(loads_adapters=False)
    release_engine(engine, trained)
    stats = refresh_engine(engine, trained, torch.float32)
    assert engine.calls == [("sleep", SLEEP_LEVEL), ("wake_up", ("weights",)), ("load_weights",),
                            ("wake_up", ("kv_cache",)), ("reset_prefix_cache",)]
    assert SLEEP_LEVEL == 2 and not stats.adapter
    copy = plain(base_dir)
    names = dict(copy.named_parameters())          # the plain model's names, the tied head once
    assert set(engine.streamed) == set(names)
    assert not any(".lora_" in n or ".base_layer." in n for n in engine.streamed)
    assert stats.bytes == sum(t.numel() * t.element_size() for t in engine.streamed.values())
    copy.load_state_dict(engine.streamed, strict=False)
    torch.testing.assert_close(logprobs(copy, seed=2), logprobs(trained, seed=2), rtol=0, atol=1e-5)
