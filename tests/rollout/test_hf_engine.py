"""HFEngine on the tiny random Qwen3 model: log-probs, seeds, batching, stops, weights."""

import pytest
import torch

from mopd.core.generation import GenerationRequest, SamplingParams
from mopd.rollout.prompts import render_searcher_prompt
from mopd.rollout.sampling import sample_step

QUESTIONS = ["Where was band 1 formed?", "Which river flows through the town where the band was formed?",
             "Who?", "When was the city founded and by whom, and what is it known for today?"]


def requests(tokenizer, **params):
    return [GenerationRequest(render_searcher_prompt(tokenizer, q), SamplingParams(**params)) for q in QUESTIONS]


def rescore(model, prompt, completion, temperature):
    ids = torch.tensor([prompt + completion.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    t = temperature if temperature > 0 else 1.0
    logp = torch.log_softmax(logits / t, dim=-1)[len(prompt) - 1:-1]
    return logp.gather(-1, torch.tensor(completion.token_ids)[:, None]).squeeze(-1)


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)])
def test_sampling_logprobs_match_a_full_forward(hf_engine, tokenizer, temperature, top_p):
    reqs = requests(tokenizer, n=2, temperature=temperature, top_p=top_p, max_new_tokens=24, seed=3)
    out = hf_engine.generate(reqs)
    assert [len(c) for c in out] == [2] * len(reqs)
    for req, completions in zip(reqs, out):
        for c in completions:
            assert 1 <= len(c.token_ids) <= 24 and len(c.logprobs) == len(c.token_ids)
            assert c.finish_reason in ("stop", "length")
            ref = rescore(hf_engine.model, req.prompt_ids, c, temperature)
            torch.testing.assert_close(torch.tensor(c.logprobs), ref, atol=1e-4, rtol=1e-4)
            assert c.text == tokenizer.decode(c.token_ids, skip_special_tokens=True)


def test_fixed_seed_is_deterministic_and_independent_of_the_batch(hf_engine, tokenizer):
    reqs = requests(tokenizer, n=3, max_new_tokens=16, seed=11)
    a = hf_engine.generate(reqs)
    b = hf_engine.generate(reqs)
    alone = hf_engine.generate([reqs[2]])[0]
    assert [[c.token_ids for c in x] for x in a] == [[c.token_ids for c in x] for x in b]
    assert [c.token_ids for c in alone] == [c.token_ids for c in a[2]]
    assert len({tuple(c.token_ids) for c in a[0]}) > 1  # the n samples differ
    other = hf_engine.generate([GenerationRequest(reqs[2].prompt_ids, SamplingParams(n=3, max_new_tokens=16,
                                                                                      seed=12))])[0]
    assert [c.token_ids for c in other] != [c.token_ids for c in a[2]]


def test_greedy_batched_equals_one_by_one(hf_engine, tokenizer):
    reqs = requests(tokenizer, temperature=0.0, max_new_tokens=20)
    batched = hf_engine.generate(reqs)
    for req, out in zip(reqs, batched):
        assert hf_engine.generate([req])[0][0].token_ids == out[0].token_ids


def test_small_chunks_give_the_same_greedy_tokens(tiny_dir, tokenizer):
    from mopd.rollout.hf_engine import HFEngine

    big = HFEngine.from_pretrained(str(tiny_dir), device="cpu")
    small = HFEngine(big.model, tokenizer, max_batch_rows=3)
    reqs = requests(tokenizer, n=2, temperature=0.0, max_new_tokens=12)
    assert ([[c.token_ids for c in x] for x in big.generate(reqs)]
            == [[c.token_ids for c in x] for x in small.generate(reqs)])


def test_stop_strings_and_token_limits(hf_engine, tokenizer):
    free = hf_engine.generate(requests(tokenizer, temperature=0.0, max_new_tokens=30))
    for req, out in zip(requests(tokenizer, temperature=0.0, max_new_tokens=30), free):
        text = out[0].text
        # stop on a piece of what greedy decoding writes anyway: it must end right there
        piece = text[5:8] if len(text) > 8 else None
        if not piece or not piece.strip():
            continue
        params = SamplingParams(temperature=0.0, max_new_tokens=30, stop=(piece,))
        cut = hf_engine.generate([GenerationRequest(req.prompt_ids, params)])[0][0]
        assert cut.finish_reason == "stop" and piece in cut.text
        assert piece not in tokenizer.decode(cut.token_ids[:-1])
        assert cut.token_ids == out[0].token_ids[:len(cut.token_ids)]
    capped = hf_engine.generate(requests(tokenizer, temperature=1.0, max_new_tokens=3, seed=0))
    assert all(len(c[0].token_ids) <= 3 for c in capped)
    assert all(c[0].finish_reason == "length" for c in capped if len(c[0].token_ids) == 3
               and c[0].token_ids[-1] != tokenizer.eos_token_id)


def test_eos_ends_a_row(hf_engine, tokenizer):
    """Make EOS the only likely token: every row stops after one token with 'stop'."""
    model = hf_engine.model
    eos = tokenizer.eos_token_id
    bias = torch.zeros(model.config.vocab_size)
    bias[eos] = 100.0
    handle = model.lm_head.register_forward_hook(lambda m, i, o: o + bias)
    try:
        out = hf_engine.generate(requests(tokenizer, n=2, max_new_tokens=10, seed=1))
    finally:
        handle.remove()
    assert all(c.token_ids == [eos] and c.finish_reason == "stop" and c.text == "" for x in out for c in x)


def test_sample_step_top_p_and_greedy():
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    temperature = torch.tensor([1.0, 1.0, 0.0, 2.0])
    top_p = torch.tensor([1e-6, 1.0, 1.0, 0.5])
    for u in torch.linspace(0, 0.999, 7):
        tok, lp = sample_step(logits, temperature, top_p, torch.full((4,), float(u)))
        assert tok[0] == logits[0].argmax() and tok[2] == logits[2].argmax()
        probs = torch.softmax(logits[3] / 2.0, -1)
        nucleus = probs.sort(descending=True)
        keep = nucleus.indices[(nucleus.values.cumsum(0) - nucleus.values) < 0.5]
        assert tok[3] in keep
        expected = torch.log_softmax(logits / torch.tensor([1.0, 1.0, 1.0, 2.0])[:, None], -1)
        torch.testing.assert_close(lp, expected.gather(-1, tok[:, None]).squeeze(-1))


def test_sample_step_follows_the_distribution():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    u = torch.linspace(0.0005, 0.9995, 1000)
    tok, _ = sample_step(logits.expand(1000, 3), torch.ones(1000), torch.ones(1000), u)
    counts = torch.bincount(tok, minlength=3).tolist()
    assert counts == [500, 300, 200]


def test_generation_restores_training_mode_and_shared_weights_are_not_copied(tiny_dir, tokenizer):
    from transformers import AutoModelForCausalLM

    from mopd.rollout.hf_engine import HFEngine

    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    model.train()
    engine = HFEngine(model, tokenizer)
    engine.generate(requests(tokenizer, max_new_tokens=2, seed=0))
    assert model.training
    engine.load_weights(model.named_parameters())  # the trainer's own tensors: a no-op
    other = AutoModelForCausalLM.from_pretrained(tiny_dir)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.5)
    engine.load_weights(other.named_parameters())
    for (n, p), (_, q) in zip(model.named_parameters(), other.named_parameters()):
        assert torch.equal(p, q), n
    with pytest.raises(KeyError):
        engine.load_weights([("nope.weight", torch.zeros(1))])
    engine.sleep()
    engine.wake_up()


def test_a_row_samples_the_same_next_to_rows_with_other_settings(hf_engine, tokenizer):
    plain = requests(tokenizer, n=2, max_new_tokens=12, seed=21)[0]
    nucleus = GenerationRequest(plain.prompt_ids, SamplingParams(n=2, top_p=0.5, temperature=0.5,
                                                                 max_new_tokens=5, seed=4))
    alone = hf_engine.generate([plain])[0]
    mixed = hf_engine.generate([nucleus, plain])[1]
    assert [c.token_ids for c in alone] == [c.token_ids for c in mixed]


def test_full_state_dict_with_tied_aliases_loads_as_is(tiny_dir, tokenizer):
    """A trainer's full state dict names a tied weight twice (embed_tokens, lm_head): both load."""
    from transformers import AutoModelForCausalLM

    from mopd.rollout.hf_engine import HFEngine

    engine = HFEngine(AutoModelForCausalLM.from_pretrained(tiny_dir), tokenizer)
    src = AutoModelForCausalLM.from_pretrained(tiny_dir)
    with torch.no_grad():
        for p in src.parameters():
            p.add_(torch.randn_like(p))
    sd = src.state_dict()
    assert src.config.tie_word_embeddings and "lm_head.weight" in sd
    engine.load_weights(sd.items())
    for name, t in sd.items():
        assert torch.equal(engine.model.state_dict()[name], t), name
    assert engine.model.lm_head.weight.data_ptr() == engine.model.model.embed_tokens.weight.data_ptr()


@pytest.mark.parametrize("read_every", [3, 8])
def test_reading_tokens_every_few_steps_keeps_the_records(hf_engine, tokenizer, read_every):
    """An accelerator's engine reads the sampled tokens every few steps (rows that ended in between
    sample on until the read): the records are those of a read every step, EOS, stop strings and
    token limits included."""
    reqs = requests(tokenizer, n=3, max_new_tokens=29, seed=5)
    reqs += [GenerationRequest(reqs[1].prompt_ids, SamplingParams(n=2, max_new_tokens=7, seed=6, stop=("e", "a"))),
             GenerationRequest(reqs[3].prompt_ids, SamplingParams(n=2, temperature=0.0, max_new_tokens=11))]
    model = hf_engine.model
    bias = torch.zeros(model.config.vocab_size)
    bias[tokenizer.eos_token_id] = 4.0   # EOS likely enough that some rows end early
    handle = model.lm_head.register_forward_hook(lambda m, i, o: o + bias)
    try:
        hf_engine.read_every = 1
        want = hf_engine.generate(reqs)
        hf_engine.read_every = read_every
        got = hf_engine.generate(reqs)
    finally:
        hf_engine.read_every = None
        handle.remove()
    reasons = [c.finish_reason for x in want for c in x]
    assert "stop" in reasons and "length" in reasons
    assert any(0 < len(c.token_ids) < 29 and c.token_ids[-1] == tokenizer.eos_token_id for c in want[0])
    for w, g in zip(want, got):
        assert [(c.token_ids, c.logprobs, c.finish_reason, c.text) for c in w] == \
               [(c.token_ids, c.logprobs, c.finish_reason, c.text) for c in g]
