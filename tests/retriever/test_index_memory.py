"""A flat FAISS index is memory-mapped where faiss can, else refused when it does not fit.

faiss's IO_FLAG_MMAP maps only IVF lists: a flat index read with it was copied into RAM whole
(65 GB of host memory for wiki-18). IO_FLAG_MMAP_IFC maps the vectors from the file."""

import numpy as np
import pytest

from mopd.retriever import index_faiss
from mopd.retriever.index_errors import IndexDirError
from mopd.retriever.index_faiss import FaissIndex, read_header, read_index_file

faiss = pytest.importorskip("faiss")


def _flat(path, n, d, seed=0):
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    idx = faiss.IndexFlatIP(d)
    idx.add(x)
    faiss.write_index(idx, str(path))
    return x


def _rss_anon_mib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:")) / 1024


@pytest.mark.skipif(not hasattr(faiss, "IO_FLAG_MMAP_IFC"), reason="this faiss cannot memory-map a flat index")
def test_a_flat_index_is_mapped_not_copied(tmp_path):
    path = tmp_path / "flat.index"
    x = _flat(path, 48_611, 384)                                   # 71 MiB of vectors
    del x
    size_mib = path.stat().st_size / (1 << 20)
    before = _rss_anon_mib()
    idx = read_index_file(path)
    q = np.random.default_rng(1).standard_normal((3, 384)).astype(np.float32)
    scores, ids = idx.search(q, 5)                                 # touches every vector
    grown = _rss_anon_mib() - before
    assert grown < size_mib / 4, f"anonymous memory grew by {grown:.0f} MiB for a {size_mib:.0f} MiB index"
    plain = faiss.read_index(str(path))
    np.testing.assert_array_equal(plain.search(q, 5)[1], ids)
    assert _rss_anon_mib() - before > size_mib * 0.9               # what the plain read costs


def test_without_the_mapping_flag_a_too_large_index_is_refused_with_the_ram_it_needs(tmp_path, monkeypatch):
    path = tmp_path / "index.faiss"
    _flat(path, 3001, 96)
    size = path.stat().st_size
    monkeypatch.setattr(index_faiss, "mmap_flat_flag", lambda faiss: None)
    monkeypatch.setattr(index_faiss, "mem_available", lambda: size - 1)
    with pytest.raises(IndexDirError) as e:
        FaissIndex.load(tmp_path, kind="flat")
    msg = str(e.value)
    assert f"needs about {size / (1 << 30):.1f} GiB of RAM" in msg and "MemAvailable" in msg and "\n" not in msg
    monkeypatch.setattr(index_faiss, "mem_available", lambda: size + 1)
    assert len(FaissIndex.load(tmp_path, kind="flat")) == 3001
    monkeypatch.setattr(index_faiss, "mem_available", lambda: None)          # no /proc/meminfo: no check
    assert len(FaissIndex.load(tmp_path, kind="flat")) == 3001


def test_the_gib_figure_is_computed_from_the_file_size(monkeypatch):
    monkeypatch.setattr(index_faiss, "mem_available", lambda: 8 << 30)
    wiki18 = 45 + 21_015_324 * 768 * 4                              # e5_Flat.index
    with pytest.raises(IndexDirError, match=r"needs about 60\.1 GiB of RAM and this machine has 8\.0 GiB"):
        index_faiss.check_memory(wiki18, "loading e5_Flat.index")


def test_header_is_read_without_faiss_and_checks_the_size(tmp_path):
    path = tmp_path / "i.faiss"
    _flat(path, 997, 24)
    h = read_header(path)
    assert (h.fourcc, h.d, h.ntotal, h.flat, h.size) == ("IxFI", 24, 997, True, 45 + 997 * 24 * 4)
    assert h.expected_size == h.size
    path.write_bytes(path.read_bytes()[:-96])
    from mopd.retriever.index_faiss import check_flat_size

    with pytest.raises(IndexDirError, match="incomplete or has extra bytes"):
        check_flat_size(read_header(path), path)
    (tmp_path / "junk").write_bytes(b"\x00" * 100)
    with pytest.raises(IndexDirError, match="does not start with a FAISS index header"):
        read_header(tmp_path / "junk")


def test_import_needs_no_read_of_the_vectors_where_faiss_cannot_map_them(tmp_path, monkeypatch, small_corpus):
    import json

    from mopd.retriever.importer import import_index

    n = sum(1 for line in open(small_corpus) if line.strip())
    path = tmp_path / "e5_Flat.index"
    _flat(path, n, 384)
    monkeypatch.setattr(index_faiss, "mmap_flat_flag", lambda faiss: None)

    def no_read(*a, **k):
        raise AssertionError("the index was read whole")

    monkeypatch.setattr(faiss, "read_index", no_read)
    out = import_index(small_corpus, path, tmp_path / "idx", encoder="minilm")
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["kind"], meta["num_passages"], meta["dim"]) == ("flat", n, 384)
