"""Packed attention (mopd.train.packed_attention): a packed micro-batch's hidden states and
parameter gradients equal those of each call run alone, on every path that runs on CPU, on a
tiny Qwen3 with grouped-query attention (6 query heads, 2 K/V heads) and calls of odd lengths."""

import importlib.util

import pytest
import torch

from mopd.train import packed_attention as pa
from mopd.train.model import ModelLoadError, choose_attn, load_causal_lm, packed_hidden
from mopd.train.packing import build_packed_batch

LENGTHS = (7, 23, 1, 40, 13, 2)
VOCAB = 97


def tiny_gqa_model(seed=0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=2, head_dim=8, max_position_embeddings=512)
    cfg._attn_implementation = "sdpa"
    return Qwen3ForCausalLM(cfg).eval()


def random_calls(seed=1, lengths=LENGTHS):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]


def packed(calls):
    zeros = [[0.0] * len(c) for c in calls]
    return build_packed_batch(calls, [[0] * len(c) for c in calls], zeros, zeros)


def each_alone(model, calls):
    """Hidden states of every call run by itself (no packing, no padding), concatenated."""
    return torch.cat([model.model(input_ids=torch.tensor(c)[None], use_cache=False).last_hidden_state[0]
                      for c in calls])


@pytest.fixture
def eager_flex(monkeypatch):
    """FlexAttention uncompiled (its reference path; the compile takes ~10 s and is tested slow)."""
    import warnings

    from torch.nn.attention.flex_attention import flex_attention

    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")

    monkeypatch.setattr(pa, "compiled_flex", lambda: flex_attention)


@pytest.fixture
def reference_varlen(monkeypatch):
    """torch's varlen_attn is CUDA only: the wrapper's plumbing runs on the pure-torch stand-in."""
    monkeypatch.setattr(pa, "_varlen_kernel", pa.reference_varlen_attn)


def with_impl(model, impl):
    if impl in pa.NAMES:
        pa.register()
    model.set_attn_implementation(impl)
    return model


PATHS = pytest.mark.parametrize("impl", ["sdpa", pa.SEGMENTS, pa.FLEX, pa.VARLEN, choose_attn("auto", torch.device("cpu"))],
                                ids=["padded", "segments", "flex", "varlen", "cpu-auto"])


@PATHS
def test_packed_hidden_states_equal_each_call_alone(impl, eager_flex, reference_varlen):
    model = tiny_gqa_model()
    calls = random_calls()
    with torch.no_grad():
        ref = each_alone(model, calls)
        got = packed_hidden(with_impl(model, impl), packed(calls))
    assert got.shape == ref.shape == (sum(LENGTHS), 48)
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)


@PATHS
def test_packed_parameter_gradients_equal_the_sum_over_calls(impl, eager_flex, reference_varlen):
    model = tiny_gqa_model()
    calls = random_calls(seed=2)
    w = torch.randn(sum(LENGTHS), 48, generator=torch.Generator().manual_seed(3))
    (each_alone(model, calls) * w).sum().backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    (packed_hidden(with_impl(model, impl), packed(calls)) * w).sum().backward()
    got = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert got.keys() == ref.keys() and len(ref) > 10      # everything but the unused lm-head
    for name, grad in got.items():
        torch.testing.assert_close(grad, ref[name], atol=1e-4, rtol=1e-4, msg=name)


def test_reference_varlen_attn_is_block_diagonal_causal_attention_with_grouped_heads():
    """The stand-in the varlen tests rely on, against attention written out with an explicit
    [L, L] mask: softmax over the same call's earlier tokens, query head h on K/V head h // 3."""
    g = torch.Generator().manual_seed(4)
    lengths, hq, hkv, d = [5, 1, 12, 3], 6, 2, 8
    total = sum(lengths)
    q, k, v = (torch.randn(total, h, d, generator=g) for h in (hq, hkv, hkv))
    cu = torch.tensor([0, 5, 6, 18, 21], dtype=torch.int32)
    got = pa.reference_varlen_attn(q, k, v, cu, cu, 12, 12, scale=0.3, window_size=(-1, 0), enable_gqa=True)
    seq = torch.repeat_interleave(torch.arange(4), torch.tensor(lengths))
    pos = torch.arange(total)
    allowed = (seq[:, None] == seq[None, :]) & (pos[:, None] >= pos[None, :])
    kk, vv = k.repeat_interleave(3, dim=1), v.repeat_interleave(3, dim=1)
    scores = torch.einsum("ihd,jhd->hij", q, kk) * 0.3
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    want = torch.einsum("hij,jhd->ihd", probs, vv)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_varlen_wrapper_repeats_kv_heads_and_says_causal_for_a_torch_without_enable_gqa(monkeypatch):
    """torch 2.10's varlen_attn takes is_causal and no enable_gqa: the wrapper repeats K/V heads."""
    seen = []

    def old_varlen(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None, scale=None):
        seen.append((is_causal, key.shape[1], max_q, cu_seq_q.dtype))
        assert is_causal and query.shape[1] == key.shape[1]
        return pa.reference_varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale=scale,
                                        window_size=(-1, 0))

    monkeypatch.setattr(pa, "_varlen_kernel", old_varlen)
    model = tiny_gqa_model()
    calls = random_calls(seed=5)
    with torch.no_grad():
        ref = each_alone(model, calls)
        got = packed_hidden(with_impl(model, pa.VARLEN), packed(calls))
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)
    assert seen == [(True, 6, 40, torch.int32)] * 2   # once per layer, K/V at 6 heads, the longest call


def test_the_layout_is_computed_once_per_micro_batch_and_reaches_every_layer(monkeypatch, reference_varlen):
    made, used = [], []
    real_layout, real_kernel = pa.packed_layout, pa.reference_varlen_attn

    def counting_layout(*a, **kw):
        made.append(real_layout(*a, **kw))
        return made[-1]

    def recording_kernel(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1), enable_gqa=False):
        used.append(cu_q)
        return real_kernel(q, k, v, cu_q, cu_k, max_q, max_k, scale=scale, window_size=window_size,
                           enable_gqa=enable_gqa)

    monkeypatch.setattr(pa, "packed_layout", counting_layout)
    monkeypatch.setattr(pa, "_varlen_kernel", recording_kernel)
    model = with_impl(tiny_gqa_model(), pa.VARLEN)
    with torch.no_grad():
        packed_hidden(model, packed(random_calls()))
    assert len(made) == 1 and len(used) == 2 and all(u is made[0].cu_seqlens for u in used)
    assert made[0].lengths == LENGTHS and made[0].max_len == 40


@pytest.mark.parametrize("impl", [pa.SEGMENTS, pa.FLEX, pa.VARLEN])
def test_a_call_without_a_layout_is_ordinary_sdpa_with_its_padding_mask(impl, reference_varlen):
    """An HF engine sharing the trainer's model generates from padded rows with a KV cache: the
    packed names compute transformers' SDPA there."""
    calls = random_calls(seed=6, lengths=(9, 4))
    ids = torch.zeros(2, 9, dtype=torch.long)
    mask = torch.zeros(2, 9, dtype=torch.long)
    ids[0], ids[1, 5:] = torch.tensor(calls[0]), torch.tensor(calls[1])   # left padding, as generation
    mask[0], mask[1, 5:] = 1, 1
    model = tiny_gqa_model()
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
        got = with_impl(model, impl)(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], atol=1e-5, rtol=1e-5)


# --- which implementation a run gets --------------------------------------------------------------

@pytest.fixture
def mocked_cuda(monkeypatch):
    """A CUDA machine as load_causal_lm sees it, flash-attn installed or not (no GPU needed)."""
    real_find_spec = importlib.util.find_spec
    state = {"flash": False}

    def find_spec(name, *a, **kw):
        if name == "flash_attn":
            return object() if state["flash"] else None
        return real_find_spec(name, *a, **kw)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    return state


def test_auto_on_cuda_picks_flash_attn_when_installed_else_torch_varlen(mocked_cuda, monkeypatch):
    cuda = torch.device("cuda")
    assert choose_attn("auto", cuda) == pa.VARLEN
    assert choose_attn("varlen", cuda) == pa.VARLEN
    mocked_cuda["flash"] = True
    assert choose_attn("auto", cuda) == "flash_attention_2" == choose_attn("flash", cuda)
    mocked_cuda["flash"] = False
    monkeypatch.setattr(pa, "torch_varlen_attn", lambda: None)      # a torch before 2.10
    assert choose_attn("auto", cuda) == "sdpa"


def test_the_named_choices_keep_their_meaning():
    cpu = torch.device("cpu")
    assert choose_attn("sdpa", cpu) == "sdpa" and choose_attn("eager", cpu) == "eager"
    assert choose_attn("flex", cpu) == pa.FLEX and choose_attn("packed_sdpa", cpu) == pa.SEGMENTS
    assert choose_attn("auto", cpu) in ("sdpa", pa.SEGMENTS, pa.FLEX)


@pytest.mark.parametrize("attn", ["varlen", "flash"])
def test_a_choice_this_machine_cannot_run_is_refused_in_one_line(attn, tiny_model_dir, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ModelLoadError) as e:
        load_causal_lm(tiny_model_dir, dtype=torch.float32, device=torch.device("cpu"), attn=attn)
    assert "\n" not in str(e.value) and f"model.attn_implementation={attn}" in str(e.value)


@pytest.mark.parametrize("attn", ["flex", "packed_sdpa"])
def test_load_causal_lm_gives_the_packed_paths_the_padded_results(attn, tiny_model_dir, eager_flex):
    model, _ = load_causal_lm(tiny_model_dir, dtype=torch.float32, device=torch.device("cpu"), attn=attn)
    ref, _ = load_causal_lm(tiny_model_dir, dtype=torch.float32, device=torch.device("cpu"), attn="sdpa")
    assert model.config._attn_implementation == choose_attn(attn, torch.device("cpu"))
    g = torch.Generator().manual_seed(7)
    calls = [torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist() for n in (11, 3, 30)]
    with torch.no_grad():
        torch.testing.assert_close(packed_hidden(model, packed(calls)), packed_hidden(ref, packed(calls)),
                                   atol=2e-5, rtol=1e-4)


def test_config_accepts_the_packed_choices_and_refuses_others():
    from mopd.config import ModelConfig

    for name in ("auto", "sdpa", "eager", "flash", "varlen", "flex", "packed_sdpa"):
        ModelConfig(attn_implementation=name)
    with pytest.raises(Exception, match="attn_implementation"):
        ModelConfig(attn_implementation="flash_attention_2")


@pytest.mark.slow
def test_compiled_flex_equals_each_call_alone():
    """The real compiled FlexAttention (CPU inductor, dynamic shapes) on a row shorter than one
    block, then rows of two, three blocks and exactly two (torch 2.13's CPU inductor fails to
    recompile after such rows: ``flex_length`` runs them longer)."""
    model = with_impl(tiny_gqa_model(), pa.FLEX)
    for seed, lengths in ((8, LENGTHS), (9, (130, 1, 57)), (10, (200, 141)), (11, (255, 1))):
        calls = random_calls(seed=seed, lengths=lengths)
        with torch.no_grad():
            ref = each_alone(model, calls)
            got = packed_hidden(model, packed(calls))
        torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("heads", [(6, 2), (4, 4)])
def test_packed_causal_attention_equals_the_padded_round_trip(threads, heads):
    """SEGMENTS' attention (per-call views on one CPU thread, the padded batch on more, a single
    call alone) gives the padded round trip's output and q/k/v gradients, on random odd lengths."""
    g = torch.Generator().manual_seed(threads * 10 + heads[0])
    hq, hkv = heads
    for lengths in ([int(n) for n in torch.randint(1, 40, (7,), generator=g) * 2 + 1], [33]):
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
        layout = pa.packed_layout(cu, torch.device("cpu"))
        L = sum(lengths)
        q, k, v = (torch.randn(L, h, 8, generator=g) for h in (hq, hkv, hkv))
        grad = torch.randn(L, hq, 8, generator=g)
        results = []
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            for fn in (pa.padded_causal_attention, pa.packed_causal_attention):
                leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
                out = fn(*leaves, layout, 0.3)
                out.backward(grad)
                results.append([out.detach()] + [t.grad for t in leaves])
        finally:
            torch.set_num_threads(before)
        for want, got in zip(*results):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        ref = pa.segment_attention(q, k, v, lengths, 0.3)
        torch.testing.assert_close(results[1][0], ref, rtol=1e-5, atol=1e-5)
