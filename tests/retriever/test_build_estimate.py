"""build-index says what it will write and how long it will take before the work, refuses
a disk that cannot hold it, and can encode on several devices at once."""

import re
import shutil
import threading
from collections import namedtuple

import numpy as np
import pytest

from mopd.cli import main
from mopd.retriever.builder import IndexSpec, build_index, human_bytes, index_bytes

pytest.importorskip("faiss")


def test_sizes():
    assert index_bytes("flat", 21_015_324, 768) == 21_015_324 * 768 * 4 and human_bytes(64_559_075_328) == "64.6 GB"
    assert index_bytes("torch", 7, 3) == 84 and index_bytes("ivf", 10, 16) == 240
    assert index_bytes("hnsw", 10, 16) == 10 * (64 + 2 * 32 * 4)
    assert [human_bytes(x) for x in (999, 1000, 56_832, 3.2e12)] == ["999 B", "1.0 kB", "56.8 kB", "3.2 TB"]


def test_the_estimate_comes_before_the_encoding_and_the_rate_after_the_first_batch(small_corpus, tmp_path, capsys):
    n, chunk = 37, 16
    build_index(small_corpus, tmp_path / "i", IndexSpec(index_kind="flat", chunk_size=chunk, max_passages=n),
                progress=True)
    err = capsys.readouterr().err
    vectors = n * 384 * 4
    line = next(x for x in err.splitlines() if x.startswith("build-index:"))
    assert f"{n:,} passages x 384 dims x 4 B = {human_bytes(vectors)} of vectors" in line
    assert f"{human_bytes(vectors)} of chunks" in line and f"{human_bytes(2 * vectors)} needed" in line
    firsts = [x for x in err.splitlines() if x.startswith("first batch:")]
    assert len(firsts) == 1 and re.search(rf"first batch: {chunk} passages in [0-9.]+ s on cpu .* for the other "
                                          rf"{n - chunk} ", firsts[0])
    assert err.index("build-index:") < err.index("first batch:") < err.index("assembling the flat index")


def test_a_disk_too_small_is_refused_before_anything_is_encoded(small_corpus, tmp_path, capsys, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10 ** 9, 10 ** 9 - 50_000, 50_000))
    out = tmp_path / "i"
    rc = main(["retriever", "build-index", "--corpus", str(small_corpus), "--max-passages", "40",
               "--chunk-size", "16", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    # 40 x 384 x 4 = 61.4 kB of chunks + 61.4 kB of index
    assert rc == 2 and "needs about 122.9 kB free" in err and "it has 50.0 kB" in err, err
    assert not out.exists()                       # nothing encoded: the fresh directory is removed


def test_encoding_split_over_devices_gives_the_same_index(small_corpus, tmp_path, monkeypatch):
    """`build-index --encoder-devices all` on (faked) two GPUs: replicas of the encoder, each chunk split
    over them, the same vectors as one device."""
    from mopd.retriever import encoders
    from mopd.retriever.encoders import load_encoder, replicate
    from mopd.retriever.index_faiss import flat_vectors

    real = load_encoder("minilm", device="cpu")
    lock = threading.Lock()          # the fakes share one real encoder (and its tokenizer's per-call state)
    calls = []

    class OnGpu:
        def __init__(self, device):
            self.device, self.name, self.dim, self.spec = device, real.name, real.dim, real.spec

        def encode_passages(self, texts, on_batch=None):
            calls.append((self.device, len(texts)))
            with lock:
                return real.encode_passages(texts, on_batch=on_batch)

    monkeypatch.setattr(encoders, "cuda_device_count", lambda: 2)
    monkeypatch.setattr(encoders, "replicate", lambda enc, devs: replicate(enc, devs, load=lambda *a: OnGpu(a[2])))
    args = ["--corpus", str(small_corpus), "--max-passages", "50", "--chunk-size", "32", "--device", "cpu"]
    assert main(["retriever", "build-index", *args, "--out", str(tmp_path / "two"), "--encoder-devices", "all"]) == 0
    assert main(["retriever", "build-index", *args, "--out", str(tmp_path / "one")]) == 0
    assert sorted(calls) == [("cuda:0", 9), ("cuda:0", 16), ("cuda:1", 9), ("cuda:1", 16)]   # chunks of 32 and 18
    np.testing.assert_allclose(flat_vectors(tmp_path / "two" / "index.faiss"),
                               flat_vectors(tmp_path / "one" / "index.faiss"), atol=1e-5)
