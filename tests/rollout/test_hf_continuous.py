"""Continuous batching on the HF engine: requests that join a running batch at any step sample what
one ``generate`` call over all of them samples."""

import threading
import time

import pytest
import torch

from mopd.core.generation import GenerationRequest, SamplingParams
from mopd.rollout.async_engine import FrontClosed, engine_front
from mopd.rollout.hf_continuous import HFStepFront


def requests(tokenizer, count=11):
    texts = ["band", "Where was band 3 formed? <search>", "a river", "Doc 1(Title: T0) text about towns",
             "<report>", "the festival in the town of", "x y z", "Question: who"]
    out = []
    for i in range(count):
        ids = tokenizer.encode(texts[i % len(texts)] * (1 + i % 3), add_special_tokens=False)
        params = SamplingParams(n=3 if i % 4 == 1 else 1, temperature=0.0 if i % 5 == 0 else 1.0,
                                top_p=0.9 if i % 3 == 0 else 1.0, max_new_tokens=4 + (7 * i) % 17,
                                stop=("</search>", "</report>") if i % 2 else (), seed=100 + i)
        out.append(GenerationRequest(ids, params))
    return out


@pytest.fixture(scope="module")
def hf_engine(tiny_dir, tokenizer):
    """The tiny model in float64: a batch's shape changes a float32 logit in its last bits, which
    flips a sampled token whenever a uniform draw lands that close to a CDF boundary (about once in
    a thousand tokens of this near-uniform random model), so which rows share a step, a matter of
    timing on a loaded machine, would decide the test. The sampler rounds the float64 logits to
    float32, where the batch's shape leaves them equal."""
    from transformers import AutoModelForCausalLM

    from mopd.rollout.hf_engine import HFEngine

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float64).eval()
    return HFEngine(model, tokenizer)


@pytest.fixture
def rows_per_forward(hf_engine):
    sizes = []
    forward = hf_engine._forward
    hf_engine._forward = lambda ids, *a: (sizes.append(ids.shape[0]), forward(ids, *a))[1]
    yield sizes
    del hf_engine._forward


def test_rows_joining_mid_flight_sample_what_one_generate_call_does(hf_engine, tokenizer, rows_per_forward):
    reqs = requests(tokenizer)
    hf_engine.reset_prefix_cache()
    want = hf_engine.generate(reqs)
    hf_engine.reset_prefix_cache()
    rows_per_forward.clear()
    front = engine_front(hf_engine, max_batch_calls=6)
    assert isinstance(front, HFStepFront)
    try:
        futures = []
        for i, r in enumerate(reqs):  # staggered arrivals: most join a batch that is already decoding
            futures.append(front.submit(r))
            if i % 3 == 2:
                time.sleep(0.02)
        got = [f.result(120) for f in futures]
    finally:
        front.close()
    for g, w in zip(got, want, strict=True):
        assert [c.token_ids for c in g] == [c.token_ids for c in w]
        assert [c.finish_reason for c in g] == [c.finish_reason for c in w]
        assert [c.text for c in g] == [c.text for c in w]
        for a, b in zip(g, w):
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)
    decode_sizes = rows_per_forward
    assert max(decode_sizes) <= 6 and len(set(decode_sizes)) > 2  # capped, and the batch changed size
    assert front.meter.mean_rows > 1 and not any(t.is_alive() for t in front._threads)


def test_close_fails_what_is_unfinished_and_ends_the_thread(hf_engine, tokenizer):
    front = HFStepFront(hf_engine, max_rows=2)
    long = [GenerationRequest(r.prompt_ids, SamplingParams(max_new_tokens=400, seed=1))
            for r in requests(tokenizer, 4)]
    futures = [front.submit(r) for r in long]  # two run, two wait
    time.sleep(0.05)
    front.close()
    for f in futures:
        with pytest.raises(FrontClosed):
            f.result(10)
    assert not [t for t in threading.enumerate() if t.name.startswith("mopd-")]
    other = HFStepFront(hf_engine)
    with pytest.raises(ValueError, match="empty prompt"):
        other.submit(GenerationRequest([], SamplingParams()))
    other.close()
