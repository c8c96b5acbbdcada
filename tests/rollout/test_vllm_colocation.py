"""VLLMEngine's placement, seeds, sleep/wake and weight streaming, against a fake ``vllm`` module.

The fake records what vLLM would be asked, including what only a GPU platform does (sleep mode);
tests/vllm runs the real engine (CPU build, `make test-vllm`). The last test checks the same
keyword arguments against vLLM's real signatures where vLLM is importable.
"""

import dataclasses
import importlib.util
import inspect
import random
import sys
import types
from typing import ClassVar

import numpy as np
import pytest
import torch

from mopd.config import ConfigError, RolloutConfig
from mopd.rollout import vllm_engine
from mopd.rollout.vllm_engine import VLLMEngine, engine_kwargs

BASE = {"gpu_memory_utilization": 0.85, "tensor_parallel_size": 1, "dtype": "auto", "seed": 7,
        "max_model_len": 8704}


def torchrun_env(rank, world, per_node=8):
    return {"RANK": str(rank), "LOCAL_RANK": str(rank % per_node), "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_one_process_without_torchrun_uses_vllms_own_executor():
    kw = engine_kwargs("/m", **BASE, env={})
    assert "distributed_executor_backend" not in kw
    assert kw["max_model_len"] == 8704 and kw["seed"] == 7 and kw["enable_sleep_mode"]
    assert kw["logprobs_mode"] == "processed_logprobs"


@pytest.mark.parametrize("world", [1, 2, 8])
def test_every_torchrun_rank_gets_the_external_launcher_its_seed_and_the_length_limit(world):
    seeds = set()
    for rank in range(world):
        kw = engine_kwargs("/m", **BASE, env=torchrun_env(rank, world))
        assert kw["distributed_executor_backend"] == "external_launcher"
        assert kw["max_model_len"] == 8704 and kw["gpu_memory_utilization"] == 0.85
        seeds.add(kw["seed"])
    assert len(seeds) == world                  # ranks sample their own questions with their own seeds


def test_a_cpu_platform_gets_float32_a_fixed_kv_cache_unchunked_prefill_and_no_sleep_mode():
    cpu = vllm_engine.Platform(cpu=True, sleep_mode=False)
    kw = engine_kwargs("/m", **BASE, env={}, platform=cpu)
    assert "enable_sleep_mode" not in kw                     # vLLM refuses it where there is none
    assert kw["dtype"] == "float32"                          # model.dtype=auto on a CPU
    assert kw["kv_cache_memory_bytes"] == vllm_engine.CPU_KV_CACHE_BYTES
    assert kw["enable_chunked_prefill"] is False and kw["enforce_eager"] is True
    assert engine_kwargs("/m", **{**BASE, "dtype": "bfloat16"}, env={}, platform=cpu)["dtype"] == "bfloat16"
    gpu = engine_kwargs("/m", **BASE, env={})
    assert gpu["enable_sleep_mode"] and gpu["dtype"] == "auto"
    assert not {"kv_cache_memory_bytes", "enable_chunked_prefill", "enforce_eager"} & set(gpu)


def test_tensor_parallel_under_torchrun_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match="tensor_parallel_size=2 under torchrun"):
        engine_kwargs("/m", **{**BASE, "tensor_parallel_size": 2}, env=torchrun_env(0, 8))


class FakeModel:
    def __init__(self):
        self.loaded = []

    def load_weights(self, weights):
        names = set()
        for name, tensor in weights:
            self.loaded.append((name, tensor.device.type, tensor.dtype))
            names.add(name)
        return names


@dataclasses.dataclass(frozen=True)
class FakeLoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str


class FakeLLMEngine:
    """vLLM's LoRA cache, as the engine reaches it: adapters by id; a path named "bad" fails to load."""

    def __init__(self, calls):
        self.calls = calls
        self.loras = {}

    def add_lora(self, request):
        if "bad" in request.lora_path:
            raise ValueError(f"LoRA rank 64 is greater than max_lora_rank 16 ({request.lora_path})")
        self.calls.append(("add_lora", request.lora_int_id, request.lora_path))
        self.loras[request.lora_int_id] = request
        return True

    def remove_lora(self, lora_id):
        self.calls.append(("remove_lora", lora_id))
        return self.loras.pop(lora_id, None) is not None


class FakeLLM:
    """Calls what vLLM's in-process executor would: collective_rpc(fn) runs fn(worker, *args)."""

    instances: ClassVar[list] = []

    def __init__(self, **kwargs):
        import os

        self.kwargs = kwargs
        self.local_rank_seen = os.environ.get("LOCAL_RANK")
        self.calls = []
        self.model = FakeModel()
        self.worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(get_model=lambda: self.model),
                                            vllm_config=object())
        self.llm_engine = FakeLLMEngine(self.calls)
        torch.manual_seed(kwargs["seed"])       # vLLM reseeds every generator at start-up
        np.random.seed(kwargs["seed"])
        random.seed(kwargs["seed"])
        FakeLLM.instances.append(self)

    def get_tokenizer(self):
        return None

    def sleep(self, level=1):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags) if tags else None))

    def reset_prefix_cache(self):
        self.calls.append(("reset",))

    def generate(self, prompts, params, use_tqdm=True, lora_request=None):
        self.calls.append(("generate", lora_request))
        return []

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.calls.append(("rpc", method.__name__))
        return [method(self.worker, *args, **(kwargs or {}))]


@pytest.fixture
def fake_vllm(monkeypatch):
    from contextlib import nullcontext

    config = types.ModuleType("vllm.config")
    config.set_current_vllm_config = lambda cfg: nullcontext()
    lora_request = types.ModuleType("vllm.lora.request")
    lora_request.LoRARequest = FakeLoRARequest
    module = types.ModuleType("vllm")
    module.LLM = FakeLLM
    module.config = config
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setitem(sys.modules, "vllm.config", config)
    monkeypatch.setitem(sys.modules, "vllm.lora", types.ModuleType("vllm.lora"))
    monkeypatch.setitem(sys.modules, "vllm.lora.request", lora_request)
    monkeypatch.setattr(vllm_engine, "import_vllm", lambda: module)
    monkeypatch.setattr(vllm_engine, "current_platform", lambda: vllm_engine.GPU)   # what the fake stands for
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    FakeLLM.instances.clear()
    return module


def test_build_engine_passes_the_length_limit_and_memory_share_from_the_config(fake_vllm, monkeypatch):
    from mopd.rollout.engines import build_engine

    for k in ("RANK", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    cfg = RolloutConfig(engine="vllm", max_input_tokens=8192, max_output_tokens=512)
    build_engine(cfg, "/models/qwen")
    kw = FakeLLM.instances[-1].kwargs
    assert kw["max_model_len"] == 8192 + 512
    # unset: the standalone share (the trainer and `mopd eval run` fill in the memory plan's first)
    assert cfg.gpu_memory_utilization is None and kw["gpu_memory_utilization"] == 0.85
    build_engine(dataclasses.replace(cfg, gpu_memory_utilization=0.62), "/models/qwen")
    assert FakeLLM.instances[-1].kwargs["gpu_memory_utilization"] == 0.62


def test_engine_on_rank_3_uses_the_trainers_device_and_keeps_the_callers_rng(fake_vllm, monkeypatch):
    for k, v in torchrun_env(3, 8, per_node=4).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)   # e.g. a launcher remapping devices
    torch.manual_seed(1234 + 3)
    expected = torch.rand(4)
    torch.manual_seed(1234 + 3)
    np_state = np.random.get_state()[1].copy()
    engine = VLLMEngine("/models/qwen", seed=0, max_model_len=4096)
    llm = FakeLLM.instances[-1]
    assert llm.kwargs["distributed_executor_backend"] == "external_launcher"
    assert llm.kwargs["max_model_len"] == 4096 and llm.kwargs["seed"] == 3
    assert llm.local_rank_seen == "2"                       # the worker's device is the trainer's
    import os

    assert os.environ["LOCAL_RANK"] == "3" and os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert torch.equal(torch.rand(4), expected)             # per-rank stream, not vLLM's reseed
    assert np.array_equal(np.random.get_state()[1], np_state)
    assert engine.in_process


def test_sleep_wake_and_streamed_load_reach_vllm_in_order(fake_vllm, monkeypatch):
    for k, v in torchrun_env(0, 2).items():
        monkeypatch.setenv(k, v)
    engine = VLLMEngine("/models/qwen")
    llm = FakeLLM.instances[-1]
    engine.sleep(level=2)
    engine.sleep(level=2)                                   # idempotent
    with pytest.raises(RuntimeError, match="wake_up"):
        engine.load_weights([("a", torch.zeros(1))])
    engine.wake_up(tags=["weights"])
    pulled = []

    def stream():
        for i in range(3):
            pulled.append(i)
            yield f"p{i}", torch.full((2,), float(i), dtype=torch.bfloat16)

    engine.load_weights(stream())
    engine.wake_up(tags=["kv_cache"])
    engine.wake_up(tags=["kv_cache"])                       # already awake: nothing sent
    assert llm.calls == [("sleep", 2), ("wake_up", ("weights",)), ("rpc", "load_weights_on_worker"), ("reset",),
                         ("wake_up", ("kv_cache",))]
    assert [n for n, _, _ in llm.model.loaded] == ["p0", "p1", "p2"] and pulled == [0, 1, 2]
    with pytest.raises(ValueError, match="tags"):
        engine.wake_up(tags=["everything"])


def test_with_a_separate_engine_process_each_parameter_is_its_own_call_through_host_memory(fake_vllm, monkeypatch):
    for k in ("RANK", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    engine = VLLMEngine("/models/qwen")
    llm = FakeLLM.instances[-1]
    assert not engine.in_process
    engine.load_weights((f"p{i}", torch.zeros(2)) for i in range(3))
    assert [c for c in llm.calls if c[0] == "rpc"] == [("rpc", "load_weights_on_worker")] * 3
    assert all(dev == "cpu" for _, dev, _ in llm.model.loaded)


def test_with_lora_every_adapter_is_a_new_request_that_replaces_the_last_and_generate_carries_it(
        fake_vllm, monkeypatch):
    from mopd.rollout.engines import build_engine

    for k in ("RANK", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    engine = build_engine(RolloutConfig(engine="vllm"), "/models/qwen", lora_rank=24)
    llm = FakeLLM.instances[-1]
    assert llm.kwargs["enable_lora"] and llm.kwargs["max_loras"] == 1 and llm.kwargs["max_lora_rank"] == 32
    assert engine.capabilities.loads_adapters
    engine.generate([])
    for path in ("/run/adapter", "/run/adapter", "/run/other"):    # the same directory, rewritten: reloaded
        engine.load_adapter(path)
        engine.generate([])
    with pytest.raises(ValueError, match="max_lora_rank"):
        engine.load_adapter("/run/bad")
    engine.generate([])                                          # the last good adapter stays
    first, second, third = (FakeLoRARequest(f"mopd-adapter-{i}", i, p)
                            for i, p in enumerate(("/run/adapter", "/run/adapter", "/run/other"), 1))
    assert llm.calls == [("generate", None),
                         ("add_lora", 1, "/run/adapter"), ("reset",), ("generate", first),
                         ("add_lora", 2, "/run/adapter"), ("remove_lora", 1), ("reset",), ("generate", second),
                         ("add_lora", 3, "/run/other"), ("remove_lora", 2), ("reset",), ("generate", third),
                         ("generate", third)]
    assert list(llm.llm_engine.loras) == [3]
    engine.sleep(level=1)
    with pytest.raises(RuntimeError, match="wake_up"):
        engine.load_adapter("/run/adapter")


def test_an_engine_without_lora_has_no_adapter_slots_and_refuses_an_adapter(fake_vllm, monkeypatch):
    from mopd.rollout.engines import build_engine

    for k in ("RANK", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    engine = build_engine(RolloutConfig(engine="vllm"), "/models/qwen")
    assert not {"enable_lora", "max_loras", "max_lora_rank"} & set(FakeLLM.instances[-1].kwargs)
    assert not engine.capabilities.loads_adapters
    with pytest.raises(RuntimeError, match="without LoRA"):
        engine.load_adapter("/run/adapter")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_keyword_arguments_match_vllms_real_signatures():
    import vllm
    from vllm.engine.arg_utils import EngineArgs

    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    for env in ({}, torchrun_env(5, 8)):
        for platform in (vllm_engine.GPU, vllm_engine.Platform(cpu=True, sleep_mode=False)):
            kw = engine_kwargs("/m", **BASE, env=env, platform=platform)
            assert set(kw) <= fields, set(kw) - fields
    assert set(vllm_engine.lora_kwargs(16)) <= fields
    assert vllm_engine.vllm_lora_ranks() == vllm_engine.VLLM_LORA_RANKS
    from vllm.lora.request import LoRARequest
    from vllm.v1.engine.llm_engine import LLMEngine

    assert {"lora_name", "lora_int_id", "lora_path"} <= set(LoRARequest.__struct_fields__)
    assert hasattr(LLMEngine, "add_lora") and hasattr(LLMEngine, "remove_lora")
    for method in (vllm.LLM.generate, vllm.LLM.enqueue, LLMEngine.add_request):
        assert "lora_request" in inspect.signature(method).parameters
    assert "level" in inspect.signature(vllm.LLM.sleep).parameters
    assert "tags" in inspect.signature(vllm.LLM.wake_up).parameters
    assert "args" in inspect.signature(vllm.LLM.collective_rpc).parameters
    assert "processed_logprobs" in str(inspect.signature(EngineArgs).parameters["logprobs_mode"].annotation)
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    assert hasattr(GPUModelRunner, "get_model")
