"""The colocation cycle against an engine that records what it is asked, and the streamed sync."""

import gc
import weakref

import pytest
import torch
from torch import nn

from mopd.rollout.engine import EngineCapabilities
from mopd.train.param_names import engine_name
from mopd.train.weight_sync import SLEEP_LEVEL, refresh_engine, release_engine, stream_parameters


class TiedLM(nn.Module):
    """Embedding tied to the output head, a wrapped layer (as activation checkpointing names it)."""

    def __init__(self, vocab=37, hidden=12):
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(vocab, hidden)
        block = nn.Module()
        block._checkpoint_wrapped_module = nn.Linear(hidden, hidden)
        self.model.layers = nn.ModuleList([block])
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", torch.ones(3), persistent=False)


class RecordingEngine:
    """Records every call; load_weights checks that the stream holds one tensor at a time."""

    def __init__(self, log):
        self.log = log
        self.received = {}
        self.max_alive = 0

    def generate(self, requests):
        self.log.append("rollout")
        return []

    def sleep(self, level=1):
        self.log.append(f"sleep{level}")

    def wake_up(self, tags=None):
        self.log.append("wake:" + ",".join(tags or ["all"]))

    def load_weights(self, named_tensors):
        refs = []
        for name, tensor in named_tensors:
            gc.collect()
            alive = sum(r() is not None for r in refs)
            self.max_alive = max(self.max_alive, alive)
            self.log.append(f"load:{name}")
            self.received[name] = tensor.detach().clone()
            refs.append(weakref.ref(tensor))
            del tensor

    def reset_prefix_cache(self):
        self.log.append("reset")


def test_engine_names_drop_wrapper_components():
    assert engine_name("model.layers.3._checkpoint_wrapped_module.mlp.up_proj.weight") == \
        "model.layers.3.mlp.up_proj.weight"
    assert engine_name("_orig_mod.model.norm.weight") == "model.norm.weight"
    assert engine_name("lm_head.weight") == "lm_head.weight"


def test_stream_yields_each_parameter_once_in_bf16_with_hf_names_and_tied_weights_once():
    torch.manual_seed(3)
    model = TiedLM()
    got = list(stream_parameters(model))
    names = [n for n, _ in got]
    assert names == ["model.embed_tokens.weight", "model.layers.0.weight", "model.layers.0.bias"]
    assert "lm_head.weight" not in names and "inv_freq" not in names
    for name, t in got:
        assert t.dtype == torch.bfloat16
        src = dict(model.named_parameters())[name.replace("layers.0.", "layers.0._checkpoint_wrapped_module.")]
        assert torch.equal(t, src.detach().to(torch.bfloat16))
    fp32 = dict(stream_parameters(model, torch.float32))
    assert torch.equal(fp32["model.embed_tokens.weight"], model.model.embed_tokens.weight)


def test_stream_is_lazy_and_never_holds_two_tensors():
    model = TiedLM(vocab=101, hidden=16)
    engine = RecordingEngine([])
    engine.load_weights(stream_parameters(model))
    assert engine.max_alive == 0           # every earlier tensor was freed before the next arrived
    gen = stream_parameters(model)
    assert not isinstance(gen, (list, tuple, dict))   # a generator: nothing is gathered up front
    first = next(gen)
    assert first[0] == "model.embed_tokens.weight"


def test_cycle_order_rollout_sleep_train_wake_weights_stream_wake_cache_reset(monkeypatch):
    torch.manual_seed(0)
    model = TiedLM()
    log = []
    engine = RecordingEngine(log)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: log.append("empty_cache"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    engine.generate([])
    release_engine(engine, model)
    log.append("train")
    model.model.layers[0]._checkpoint_wrapped_module(torch.randn(2, 12)).sum().backward()
    opt.step()
    refresh_engine(engine, model)

    # torch's cached blocks go back to the driver before each wake-up: vLLM's allocator cannot use them
    assert log == ["rollout", f"sleep{SLEEP_LEVEL}", "train", "empty_cache", "wake:weights",
                   "load:model.embed_tokens.weight", "load:model.layers.0.weight", "load:model.layers.0.bias",
                   "empty_cache", "wake:kv_cache", "reset"]
    assert SLEEP_LEVEL == 2
    # the engine received the updated weights, not the pre-step ones
    w = model.model.layers[0]._checkpoint_wrapped_module.weight
    assert torch.equal(engine.received["model.layers.0.weight"], w.detach().to(torch.bfloat16))


def test_an_engine_sharing_the_model_only_clears_its_prefix_cache(monkeypatch):
    model = TiedLM()
    log = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: log.append("empty_cache"))
    engine = RecordingEngine(log)
    engine.model = model
    engine.capabilities = EngineCapabilities(shares_trainer_model=True)   # as HFEngine around the module
    release_engine(engine, model)
    refresh_engine(engine, model)
    assert log == ["reset", "reset"]        # nothing woken, nothing to empty (the cache stays warm)


def test_hf_engine_level2_sleep_frees_and_the_cycle_restores_identical_sampling(tiny_model_dir, monkeypatch):
    from mopd.core.generation import GenerationRequest, SamplingParams
    from mopd.rollout.hf_engine import HFEngine

    torch.set_num_threads(1)
    engine = HFEngine.from_pretrained(tiny_model_dir, device="cpu", prefix_cache_mb=0)
    trainer_copy = HFEngine.from_pretrained(tiny_model_dir, device="cpu", prefix_cache_mb=0).model
    monkeypatch.setattr(engine, "_frees_memory", lambda: True)   # as for an owned copy on a GPU
    req = [GenerationRequest(list(range(5, 15)), SamplingParams(n=2, max_new_tokens=6, seed=11))]
    before = engine.generate(req)

    release_engine(engine, trainer_copy)
    assert all(p.is_meta for p in engine.model.parameters())          # storage released
    with pytest.raises(RuntimeError):
        engine.generate(req)
    refresh_engine(engine, trainer_copy, dtype=torch.float32)
    after = engine.generate(req)
    assert [[c.token_ids for c in r] for r in before] == [[c.token_ids for c in r] for r in after]
    emb = engine.model.get_input_embeddings().weight
    assert engine.model.get_output_embeddings().weight is emb or not engine.model.config.tie_word_embeddings


def test_a_sharded_parameter_is_cast_before_it_is_gathered(tmp_path, monkeypatch):
    """The all-gather moves (and the stream holds) the engine dtype, never the fp32 master."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    if dist.is_initialized():
        pytest.skip("needs a process group of its own")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        model = nn.Linear(6, 10)
        for name, p in list(model.named_parameters()):
            setattr(model, name, nn.Parameter(distribute_tensor(p.detach(), mesh, [Shard(0)])))
        gathered = []
        full = DTensor.full_tensor

        def recording(self, *a, **k):
            gathered.append(self.dtype)
            return full(self, *a, **k)

        monkeypatch.setattr(DTensor, "full_tensor", recording)
        got = dict(stream_parameters(model, torch.bfloat16))
        assert gathered == [torch.bfloat16, torch.bfloat16]
        assert got["weight"].dtype == torch.bfloat16 and not isinstance(got["weight"], DTensor)
        assert torch.equal(got["weight"], model.weight.detach().full_tensor().to(torch.bfloat16))
    finally:
        dist.destroy_process_group()
