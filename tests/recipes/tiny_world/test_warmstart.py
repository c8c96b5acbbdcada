"""The pi_0 warm start: the SFT loss (shared prefixes, loss masks), a few steps that learn, caching, CLI."""

import json
import random

import pytest
import torch

from mopd.cli import main
from mopd.data.sft import (PACKED, SFTSettings, micro_batches, packed_micro_batches, sft_loss_sum, sft_loss_sum_packed,
                           shared_prefix_len, train_sft)
from mopd.data import sft as sft_module
from mopd.recipes.tiny_world.world import load_split
from mopd.recipes.tiny_world.warmstart import build_pi0, make_demonstrations, read_pi0

pytestmark = pytest.mark.usefixtures("one_torch_thread")   # tiny models: one thread is fast and steady

TINY = dict(hidden=32, layers=1, heads=2, ffn=64, vocab_size=1200)


@pytest.fixture(scope="module")
def small_model():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=512, tie_word_embeddings=True)
    return Qwen3ForCausalLM(cfg).float()


def random_seqs(rng, n, prefix_len, vocab=97):
    prefix = [rng.randrange(vocab) for _ in range(prefix_len)]
    out = []
    for _ in range(n):
        env = [rng.randrange(vocab) for _ in range(rng.randrange(1, 9))]
        model = [rng.randrange(vocab) for _ in range(rng.randrange(1, 12))]
        env2 = [rng.randrange(vocab) for _ in range(rng.randrange(0, 9))]
        model2 = [rng.randrange(vocab) for _ in range(rng.randrange(0, 6))]
        ids = prefix + env + model + env2 + model2
        mask = [0] * (prefix_len + len(env)) + [1] * len(model) + [0] * len(env2) + [1] * len(model2)
        out.append((ids, mask))
    return out


def reference_loss(model, seqs):
    """Per-sequence full forward, cross-entropy of every loss-mask token given its history."""
    total, n = 0.0, 0
    for ids, mask in seqs:
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, :-1].float(), -1)
        picked = logp.gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
        trained = torch.tensor(mask[1:], dtype=torch.bool)
        total = total - picked[trained].sum()
        n += int(trained.sum())
    return total, n


@pytest.mark.parametrize("share", [False, True])
def test_sft_loss_matches_a_per_sequence_reference_in_value_and_gradient(small_model, share):
    seqs = random_seqs(random.Random(1), 5, prefix_len=13)
    loss, n = sft_loss_sum(small_model, seqs, pad_id=0, share_prefix=share)
    grads = torch.autograd.grad(loss, list(small_model.parameters()))
    ref, n_ref = reference_loss(small_model, seqs)
    ref_grads = torch.autograd.grad(ref, list(small_model.parameters()))
    assert n == n_ref
    torch.testing.assert_close(loss, ref, rtol=1e-4, atol=1e-4)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-3, atol=1e-5)


@pytest.fixture
def packed_model(small_model):
    """``small_model`` under the packed SFT attention (restored afterwards)."""
    before = small_model.config._attn_implementation
    sft_module._register_packed()
    small_model.set_attn_implementation(PACKED)
    yield small_model
    small_model.set_attn_implementation(before)


@pytest.mark.parametrize("n, prefix_len", [(5, 13), (1, 7), (7, 0)])
def test_the_packed_loss_matches_the_per_sequence_reference_in_value_and_gradient(packed_model, n, prefix_len):
    """One row, the prefix once, no padding: the loss and every gradient of the unpacked sequences
    (one sequence alone; sequences sharing no prefix; GQA heads, 4 query heads over 2 K/V)."""
    seqs = random_seqs(random.Random(n + prefix_len), n, prefix_len=prefix_len)
    w = torch.rand(97, generator=torch.Generator().manual_seed(n)) * 3
    loss, count = sft_loss_sum_packed(packed_model, seqs, token_weights=w)
    grads = torch.autograd.grad(loss, list(packed_model.parameters()))
    packed_model.set_attn_implementation("sdpa")
    ref, n_ref = sft_loss_sum(packed_model, seqs, pad_id=0, share_prefix=False, token_weights=w)
    ref_grads = torch.autograd.grad(ref, list(packed_model.parameters()))
    assert count == pytest.approx(n_ref)
    torch.testing.assert_close(loss, ref, rtol=1e-4, atol=1e-4)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-3, atol=1e-5)


def test_the_packed_attention_is_sdpa_without_a_layout(packed_model):
    """Generation through a model left under the packed attention (an interrupted SFT) is SDPA's."""
    ids = torch.tensor([[5, 9, 2, 44, 17, 3]])
    packed = packed_model(input_ids=ids).logits
    packed_model.set_attn_implementation("sdpa")
    torch.testing.assert_close(packed, packed_model(input_ids=ids).logits)


def test_packed_micro_batches_keep_each_role_in_rows_within_the_budget():
    rng = random.Random(4)
    seqs = [([k] * 20 + [rng.randrange(9) for _ in range(rng.randrange(5, 60))], [0] * 20 + [1] * 70)
            for _ in range(15) for k in (1, 2)]
    seqs = [(ids, m[:len(ids)]) for ids, m in seqs]
    batches = packed_micro_batches(seqs, budget=150)
    assert sorted(i for b in batches for i in b) == list(range(len(seqs)))
    for b in batches:
        assert len({seqs[i][0][0] for i in b}) == 1 and b == sorted(b)
        group = [seqs[i] for i in range(len(seqs)) if seqs[i][0][0] == seqs[b[0]][0][0]]
        prefix = shared_prefix_len(group)
        assert len(b) == 1 or prefix + sum(len(seqs[i][0]) - prefix for i in b) <= 150
    assert len(packed_micro_batches(seqs, budget=10 ** 6)) == 2   # one row per role


def test_packed_and_padded_sft_train_the_same_weights(small_model):
    """A few optimiser steps either way: the same losses and weights (float tolerance), and the
    model's attention implementation as it was."""
    import copy

    rng = random.Random(6)
    episodes = [random_seqs(rng, rng.randrange(1, 4), prefix_len=9) for _ in range(7)]
    runs = []
    for packed in (True, False):
        model = copy.deepcopy(small_model)
        losses = train_sft(model, episodes, SFTSettings(steps=3, episodes_per_step=3, lr=1e-2, seed=2, packed=packed,
                                                        micro_batch_tokens=64), pad_id=0)
        assert model.config._attn_implementation == small_model.config._attn_implementation
        runs.append((losses, [p.detach() for p in model.parameters()]))
    torch.testing.assert_close(torch.tensor(runs[0][0]), torch.tensor(runs[1][0]), rtol=1e-4, atol=1e-5)
    for a, b in zip(runs[0][1], runs[1][1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


def test_shared_prefix_stops_before_the_first_trained_token():
    seqs = [([1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 1, 1]), ([1, 2, 3, 4, 9], [0, 0, 0, 0, 1])]
    assert shared_prefix_len(seqs) == 3  # position 3 predicts the first loss token, so it is not shared
    seqs = [([1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 0, 1]), ([1, 2, 7, 4, 9, 9], [0, 0, 0, 0, 1, 1])]
    assert shared_prefix_len(seqs) == 2


def test_micro_batches_group_by_prompt_and_respect_the_budget():
    rng = random.Random(0)
    seqs = [([k] * 20 + [rng.randrange(9) for _ in range(rng.randrange(5, 60))], []) for k in (1, 2) for _ in range(15)]
    batches = micro_batches(seqs, budget=200)
    assert sorted(i for b in batches for i in b) == list(range(len(seqs)))
    for b in batches:
        assert len({seqs[i][0][0] for i in b}) == 1
        assert len(b) == 1 or len(b) * max(len(seqs[i][0]) for i in b) <= 200


def test_a_few_sft_steps_on_demonstrations_lower_the_loss(world, world_tokenizer, retriever):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    demos = make_demonstrations(world.root, world_tokenizer, retriever, attempts=1,
                                questions=load_split(world, "train")[:8])
    assert len(demos.episodes) == 16 and all(v["outputs_cut_at_max_tokens"] == 0 for v in demos.stats.values())
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=len(world_tokenizer), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                         head_dim=16, tie_word_embeddings=True))
    losses = train_sft(model, demos.episodes, SFTSettings(steps=8, episodes_per_step=2, lr=2e-2, seed=0),
                       pad_id=world_tokenizer.pad_token_id)
    assert len(losses) == 8
    assert sum(losses[-2:]) / 2 < losses[0] - 1.0


def test_build_pi0_writes_a_loadable_model_and_reuses_it(world, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = dict(steps=2, episodes_per_step=2, attempts=1, max_questions=4, practice_worlds=1, progress=False, **TINY)
    out = build_pi0(world.root, tmp_path / "pi0", **kw)
    info = read_pi0(out)
    assert info["settings"]["steps"] == 2 and len(info["losses"]) == 2 and info["seconds"]["sft"] >= 0
    assert set(info["demonstrations"]) == {"world/cmas", "world/hmas", "practice/seed100000/cmas",
                                           "practice/seed100000/hmas"}
    assert (tmp_path / "pi0_practice_worlds" / "seed100000" / "world.json").is_file()
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.hidden_size == 32 and tok.eos_token == "<|im_end|>"
    assert len(tok.encode("<search>")) == 1
    stamp = (out / "pi0.json").stat().st_mtime_ns
    assert build_pi0(world.root, tmp_path / "pi0", **kw) == out
    assert (out / "pi0.json").stat().st_mtime_ns == stamp


def test_demonstrations_built_side_by_side_give_the_same_pi0(world, tmp_path):
    """pi_0's demonstrations in two processes (one workflow each, as the demo builds them) are the
    episodes one process builds, in the same order: the same weights after SFT, bit for bit."""
    kw = dict(steps=3, episodes_per_step=3, attempts=2, max_questions=6, progress=False, **TINY)
    one = build_pi0(world.root, tmp_path / "one", **kw)
    two = build_pi0(world.root, tmp_path / "two", demo_workers=2, **kw)
    a, b = read_pi0(one), read_pi0(two)
    assert a["demonstrations"] == b["demonstrations"] and set(a["demonstrations"]) == {"world/cmas", "world/hmas"}
    assert a["losses"] == b["losses"]
    assert (one / "model.safetensors").read_bytes() == (two / "model.safetensors").read_bytes()


def test_world_cli(tmp_path, capsys):
    assert main(["world", "build", "--out", str(tmp_path / "w"), "--index", "bm25"]) == 0
    assert "train 1360" in capsys.readouterr().out
    info = json.loads((tmp_path / "w" / "world.json").read_text())
    assert info["settings"]["index_kind"] == "bm25"
    assert main(["world", "pi0", "--world", str(tmp_path / "missing"), "--out", str(tmp_path / "p")]) == 2
    assert "no finished tiny world" in capsys.readouterr().err
    assert main(["world", "check", "--model", str(tmp_path), "--world", str(tmp_path / "w")]) == 2


def test_the_pi0_tokenizer_makes_names_and_role_prompts_compact(world_tokenizer):
    from mopd.recipes.tiny_world.world_kb import name_vocabulary
    from mopd.rollout import prompts

    names = name_vocabulary()
    single = [n for n in names if len(world_tokenizer.encode(" " + n, add_special_tokens=False)) == 1]
    assert len(single) >= 0.95 * len(names)
    words = len(prompts.SEARCHER_SYSTEM.split())
    assert len(world_tokenizer.encode(prompts.SEARCHER_SYSTEM, add_special_tokens=False)) < 1.5 * words


def test_token_weights_scale_each_target_term(small_model):
    seqs = random_seqs(random.Random(2), 4, prefix_len=5)
    plain, n = sft_loss_sum(small_model, seqs, pad_id=0)
    ones, n1 = sft_loss_sum(small_model, seqs, pad_id=0, token_weights=torch.ones(97))
    torch.testing.assert_close(plain, ones)
    assert n == n1
    w = torch.ones(97)
    w[:50] = 3.0  # targets below 50 count three times
    weighted, nw = sft_loss_sum(small_model, seqs, pad_id=0, token_weights=w)
    low = [(ids, [k if ids[i] < 50 else 0 for i, k in enumerate(m)]) for ids, m in seqs]
    low_loss, n_low = sft_loss_sum(small_model, low, pad_id=0)
    torch.testing.assert_close(weighted, plain + 2 * low_loss, rtol=1e-5, atol=1e-5)
    assert nw == n + 2 * n_low
