"""The query encoder on every GPU the server uses, tested with fake device counts."""

import hashlib
import threading

import numpy as np
import pytest

from mopd.retriever.encoders import (
    ENCODERS,
    EncoderPool,
    EncoderUnavailable,
    encoder_devices,
    load_encoder,
    replicate,
)


def test_device_lists():
    assert encoder_devices("all", 3) == ["cuda:0", "cuda:1", "cuda:2"]
    assert encoder_devices("all", 0) == ["cpu"]                      # no GPU: a no-op on CPU
    assert encoder_devices("0, 2,cuda:2", 4) == ["cuda:0", "cuda:2"]
    assert encoder_devices("cuda,cpu", 1) == ["cuda:0", "cpu"]
    assert encoder_devices(None, 8) == [] and encoder_devices("", 8) == []
    with pytest.raises(EncoderUnavailable, match=r"has 2 GPU\(s\) \(cuda:0 to cuda:1\)"):
        encoder_devices("cuda:2", 2)
    with pytest.raises(EncoderUnavailable, match="has no GPU"):
        encoder_devices("0", 0)
    with pytest.raises(EncoderUnavailable, match="not cpu, cuda:N or N"):
        encoder_devices("tpu", 2)


class FakeEncoder:
    """Vectors that depend on the text alone; records what it was given and on which thread."""

    spec = ENCODERS["minilm"]
    name, dim, batch_size, model_path = "minilm", 6, 32, "/models/minilm"

    def __init__(self, device):
        self.device = device
        self.calls = []
        self.threads = set()

    def encode_queries(self, texts):
        self.calls.append(list(texts))
        self.threads.add(threading.get_ident())
        return np.array([np.frombuffer(hashlib.sha256(t.encode()).digest()[:24], np.float32) for t in texts],
                        dtype=np.float32).reshape(len(texts), self.dim)


@pytest.mark.parametrize("n_devices", [2, 3, 5])
def test_a_batch_is_split_over_the_replicas_and_put_back_in_order(n_devices):
    rng = np.random.default_rng(n_devices)
    replicas = [FakeEncoder(f"cuda:{i}") for i in range(n_devices)]
    pool = EncoderPool(replicas, min_slice=4)
    alone = FakeEncoder("cuda:0")
    for n in (4 * n_devices, 97, 4 * n_devices + 1, 301):
        texts = [f"query {rng.integers(1e9)} {i}" for i in range(n)]
        for r in replicas:
            r.calls.clear()
        np.testing.assert_array_equal(pool.encode_queries(texts), alone.encode_queries(texts))
        slices = [r.calls[0] for r in replicas]
        assert [t for s in slices for t in s] == texts                      # contiguous, in order
        assert max(map(len, slices)) - min(map(len, slices)) <= 1           # even shares


def test_small_batches_take_turns():
    replicas = [FakeEncoder(f"cuda:{i}") for i in range(3)]
    pool = EncoderPool(replicas, min_slice=8)
    for j in range(7):
        out = pool.encode_queries([f"q{j}"] * (1 + j % 3))
        assert out.shape == (1 + j % 3, 6)
    assert [len(r.calls) for r in replicas] == [3, 2, 2]
    assert replicas[1].calls[0] == ["q1", "q1"]


def test_replicate_reuses_the_encoder_and_loads_the_others_from_its_weights():
    loaded = []

    def load(name, path, device, batch_size):
        loaded.append((name, path, device, batch_size))
        return FakeEncoder(device)

    first = FakeEncoder("cuda")
    pool = replicate(first, encoder_devices("all", 4), load=load)
    assert pool.replicas[0] is first and pool.devices == ["cuda", "cuda:1", "cuda:2", "cuda:3"]
    assert loaded == [("minilm", "/models/minilm", f"cuda:{i}", 32) for i in (1, 2, 3)]
    cpu = FakeEncoder("cpu")
    assert replicate(cpu, encoder_devices("all", 0), load=load) is cpu      # CPU: no-op
    assert replicate(cpu, [], load=load) is cpu and len(loaded) == 3


def test_real_encoders_split_give_the_vectors_of_one():
    """Two real MiniLM replicas (both on the CPU here) encode a split batch on two threads."""
    from mopd.retriever.encoders import Encoder

    one = load_encoder("minilm", device="cpu")                          # the instance other tests share
    two = Encoder("minilm", device="cpu", batch_size=8)                 # a second one, its own tokenizer
    pool = EncoderPool([one, two], min_slice=4)
    texts = [f"who founded the harbour town number {i}?" * (1 + i % 3) for i in range(37)]
    np.testing.assert_allclose(pool.encode_queries(texts), one.encode_queries(texts), atol=1e-5)


def test_serve_puts_the_query_encoder_on_every_gpu(built, monkeypatch, capsys):
    """`mopd retriever serve --encoder-devices all` on a machine with (faked) three GPUs: replicas on
    cuda:1 and cuda:2 from the index's encoder weights, searches equal to one encoder's."""
    from mopd.cli import main
    from mopd.retriever import encoders, open_retriever
    from mopd.retriever import server as server_mod

    real = load_encoder("minilm", device="cpu")
    made = []
    one_at_a_time = threading.Lock()     # the replicas share one real encoder here, and so its tokenizer,
    #                                      whose padding settings are per call state (real replicas have their own)

    class OnGpu:           # the real encoder's vectors, reported on a GPU this machine lacks
        def __init__(self, device):
            self.device, self.name, self.dim, self.spec = device, real.name, real.dim, real.spec
            self.calls = 0

        def encode_queries(self, texts):
            self.calls += 1
            with one_at_a_time:
                return real.encode_queries(texts)

    def fake_load(name, path, device, batch_size):
        assert (name, path) == ("minilm", str(real.model_path))
        made.append(OnGpu(device))
        return made[-1]

    index = built("flat")
    monkeypatch.setattr(encoders, "cuda_device_count", lambda: 3)
    monkeypatch.setattr(encoders, "replicate", lambda enc, devices: replicate(enc, devices, load=fake_load))
    served = {}
    monkeypatch.setattr(server_mod, "serve", lambda retriever, host, port, **kw: served.setdefault("r", retriever))
    assert main(["retriever", "serve", "--index", str(index), "--device", "cpu", "--encoder-devices", "all",
                 "--port", "0"]) == 0
    r = served["r"]
    assert r.encoder.devices == ["cuda:0", "cuda:1", "cuda:2"] and [m.device for m in made] == ["cuda:0", "cuda:1",
                                                                                               "cuda:2"]
    assert "query encoder on cuda:0,cuda:1,cuda:2" in capsys.readouterr().out
    assert sum(m.calls for m in made) == 1      # serve's self-check: one query, searched before it listens
    for m in made:
        m.calls = 0
    queries = [f"harbour town founded {i}" for i in range(48)]
    got, want = r.search(queries, 3), open_retriever(index, device="cpu").search(queries, 3)
    assert [[p.id for p in g] for g in got] == [[p.id for p in g] for g in want]  # 3 x 16 vs 48 in a batch
    np.testing.assert_allclose([[p.score for p in g] for g in got], [[p.score for p in g] for g in want], atol=1e-5)
    assert all(m.calls == 1 for m in made)
    assert main(["retriever", "serve", "--index", str(index), "--encoder-devices", "cuda:7", "--port", "0"]) == 2
    assert "has 3 GPU(s)" in capsys.readouterr().err
