"""Engines declare what they can do, and the schedulers, the trainer's weight sync and the front
choice read the declaration (not an engine's insides)."""

import pytest

from mopd.config import RolloutConfig
from mopd.core.qa import QAExample
from mopd.core.generation import Completion, GenerationRequest, SamplingParams
from mopd.rollout.async_engine import BatchingFront, engine_front
from mopd.rollout.async_scheduler import prefers_async, run_rollout
from mopd.rollout.engine import EngineCapabilities, capabilities_of
from mopd.rollout.engines import build_engine
from mopd.rollout.run_state import WorkflowSettings
from mopd.train.weight_sync import refresh_engine, release_engine
from tests.helpers.retrievers import FakeRetriever


class Scripted:
    """A synchronous engine that declares nothing: every turn reports at once."""

    def __init__(self, tokenizer, capabilities=None):
        self.tokenizer = tokenizer
        if capabilities is not None:
            self.capabilities = capabilities
        self.calls = []

    def generate(self, requests):
        self.calls.append(len(requests))
        text = "<report>Norwick</report>"
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return [[Completion(token_ids=list(ids), logprobs=[-0.1] * len(ids), finish_reason="stop", text=text)
                 for _ in range(r.params.n)] for r in requests]

    def reset_prefix_cache(self):
        pass


def test_an_engine_that_declares_nothing_gets_no_capabilities_and_the_batching_front(tokenizer):
    engine = Scripted(tokenizer)
    assert capabilities_of(engine) == EngineCapabilities()
    assert not prefers_async(engine)
    front = engine_front(engine)
    try:
        assert isinstance(front, BatchingFront)
        got = front.submit(GenerationRequest([1, 2, 3], SamplingParams(n=3, max_new_tokens=4))).result(10)
        assert len(got) == 3 and got[0].text == "<report>Norwick</report>"
    finally:
        front.close()


def test_the_hf_engine_declares_its_step_front_and_lock_step_preference(hf_engine, tiny_dir):
    from mopd.rollout.hf_continuous import HFStepFront

    caps = hf_engine.capabilities
    assert caps.step_front and not caps.prefers_async and caps.trainer_logprobs
    assert not caps.shares_trainer_model and not caps.frees_memory      # an owned copy, on the CPU
    front = engine_front(hf_engine, max_batch_calls=5)
    try:
        assert isinstance(front, HFStepFront) and front.max_rows == 5
    finally:
        front.close()
    shared = build_engine(RolloutConfig(), str(tiny_dir), trainer_model=(hf_engine.model, hf_engine.tokenizer))
    assert shared.model is hf_engine.model and shared.capabilities.shares_trainer_model


def test_weight_sync_trusts_the_declaration_not_the_attribute(tokenizer):
    """An engine whose ``model`` is the trainer's module but that does not declare sharing is
    put to sleep and refreshed like any other engine."""
    import torch

    model = torch.nn.Linear(3, 2)
    log = []

    class Owned(Scripted):
        def sleep(self, level=1):
            log.append(("sleep", level))

        def wake_up(self, tags=None):
            log.append(("wake", tuple(tags)))

        def load_weights(self, named):
            log.append(("load", sorted(n for n, _ in named)))

    engine = Owned(tokenizer)
    engine.model = model
    release_engine(engine, model)
    refresh_engine(engine, model, torch.float32)
    assert log == [("sleep", 2), ("wake", ("weights",)), ("load", ["bias", "weight"]), ("wake", ("kv_cache",))]
    log.clear()
    engine.capabilities = EngineCapabilities(shares_trainer_model=True)
    release_engine(engine, model)
    refresh_engine(engine, model, torch.float32)
    assert log == []                                          # nothing to free or copy


@pytest.mark.parametrize("scheduler,declared,async_expected", [
    ("auto", False, False), ("auto", True, True), ("lockstep", True, False), ("async", False, True)])
def test_run_rollout_takes_the_configured_scheduler_or_the_engines_preference(
        tokenizer, monkeypatch, scheduler, declared, async_expected):
    import mopd.rollout.async_scheduler as sched

    used = []
    real = sched.run_workflows_async
    monkeypatch.setattr(sched, "run_workflows_async", lambda *a, **k: used.append("async") or real(*a, **k))
    engine = Scripted(tokenizer, EngineCapabilities(prefers_async=declared))
    questions = [QAExample(f"q{i}", "d", f"Where is town {i}?", ["Norwick"]) for i in range(3)]
    settings = WorkflowSettings(workflow="cmas", max_steps=2, max_output_tokens=8, scheduler=scheduler)
    records = run_rollout(engine, FakeRetriever(), tokenizer, questions, settings, attempts=2, progress=False)
    assert len(records) == 6 and (used == ["async"]) == async_expected
    assert all(r.calls for r in records)


def test_the_configured_scheduler_reaches_training_and_evaluation_rollouts():
    from mopd.config import ConfigError, resolve

    cfg = resolve("cmas_rl", ["rollout.scheduler=async"])
    assert WorkflowSettings.for_training(cfg, seed=3).scheduler == "async"
    assert WorkflowSettings.for_evaluation(cfg, "hmas").scheduler == "async"
    assert WorkflowSettings.for_training(resolve("cmas_rl"), seed=3).scheduler == "auto"
    with pytest.raises(ConfigError, match="rollout.scheduler"):
        resolve("cmas_rl", ["rollout.scheduler=eager"])
