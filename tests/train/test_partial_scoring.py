"""Frozen-model scoring restricted to the sequences whose roles need it."""

import random

import torch

from mopd.train.model import PackedCausalLM, load_causal_lm
from mopd.train.packing import build_packed_batch
from mopd.train.partial_scoring import score_needed, select_sequences, sequences_with_roles


def random_batch(rng, vocab, n_seqs, roles_of):
    toks, roles = [], []
    for s in range(n_seqs):
        n = rng.randint(3, 25)
        toks.append([rng.randrange(3, vocab) for _ in range(n)])
        roles.append([-1] * 2 + [roles_of(s)] * (n - 2))
    zeros = [[0.0] * len(t) for t in toks]
    return build_packed_batch(toks, roles, [[rng.random() for _ in t] for t in toks], zeros, pad_to_multiple=8)


def test_select_keeps_whole_sequences_and_their_signals():
    rng = random.Random(1)
    b = random_batch(rng, 50, 5, lambda s: s % 3)
    keep = sequences_with_roles(b, [1])
    assert keep.tolist() == [1, 4]
    sub, pos = select_sequences(b, keep)
    assert torch.equal(sub.input_ids, b.input_ids[pos]) and torch.equal(sub.advantages, b.advantages[pos])
    lengths = (b.cu_seqlens[1:] - b.cu_seqlens[:-1]).tolist()
    assert (sub.cu_seqlens[1:] - sub.cu_seqlens[:-1]).tolist() == [lengths[1], lengths[4]]
    assert sub.position_ids.tolist() == list(range(lengths[1])) + list(range(lengths[4]))
    assert sub.items == [1, 4] and sub.seq_ids.tolist() == [0] * lengths[1] + [1] * lengths[4]


def test_scores_equal_the_full_batch_where_needed_and_zero_elsewhere(tiny_model_dir):
    torch.manual_seed(0)
    lm, _ = load_causal_lm(tiny_model_dir, dtype=torch.float32, device=torch.device("cpu"), attn="sdpa")
    scorer = PackedCausalLM(lm).eval()
    rng = random.Random(4)
    b = random_batch(rng, lm.config.vocab_size, 7, lambda s: [0, 1, 2, 1][s % 4])   # searcher = role 1
    seen = []

    def score(batch):
        seen.append(batch.num_tokens)
        with torch.no_grad():
            return scorer(batch)

    full = score(b)
    part = score_needed(score, b, [1])
    need = torch.isin(b.seq_ids, sequences_with_roles(b, [1]))
    assert torch.allclose(part[need], full[need], atol=1e-5)
    assert torch.all(part[~need] == 0) and need.any() and (~need).any()
    assert seen[-1] == int(need.sum()) < b.num_tokens            # only the needed tokens went through


def test_nothing_needed_skips_or_runs_one_token_for_collectives():
    rng = random.Random(2)
    b = random_batch(rng, 50, 3, lambda s: 0)
    calls = []

    def score(batch):
        calls.append(batch.num_tokens)
        return torch.zeros(batch.num_tokens)

    out = score_needed(score, b, [1])
    assert calls == [] and out.shape == (b.num_tokens,) and not out.any()
    score_needed(score, b, [1], collective=True)
    assert calls == [1]
    every = score_needed(score, b, [0])
    assert calls[-1] == b.num_tokens - b.pad_tokens       # the role-less pad segment is not scored
    assert every.shape == (b.num_tokens,)
