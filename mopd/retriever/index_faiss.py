"""FAISS indexes: flat inner product (exact, the default; Search-R1's ``e5_Flat.index``), IVF with
8-bit scalar quantisation (approximate, 4x less memory than flat), and HNSW (approximate, faster
search, somewhat more memory than flat). All use inner product on unit vectors (= cosine).

On a machine with faiss-gpu, flat and IVF indexes can be moved to all visible GPUs, sharded, with
fp16 storage (``gpu=True``): wiki-18's 65 GB fp32 flat index becomes 32 GB split over the GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from mopd.retriever.index_errors import IndexDirError

INDEX_FILE = "index.faiss"


def import_faiss():
    """The ``faiss`` module, or a one-line error naming the extra that installs it."""
    try:
        import faiss
    except ImportError:
        raise IndexDirError("this index kind needs faiss: pip install 'multiagent-opd[cpu]' (faiss-cpu) or "
                            "'multiagent-opd[gpu]' (faiss-gpu-cu12), or build a bm25 or torch index") from None
    return faiss


FAISS_KINDS = ("flat", "ivf", "hnsw")
HNSW_M = 32
TRAIN_SAMPLE = 262144  # vectors used to train IVF centroids and quantiser


def ivf_lists(n: int) -> int:
    """IVF list count: about 4 sqrt(N) (FAISS's rule of thumb), with >= 39 training points per list."""
    return int(max(1, min(4 * np.sqrt(n), n // 39)))


def new_index(kind: str, dim: int, n: int):
    faiss = import_faiss()

    if kind == "flat":
        return faiss.IndexFlatIP(dim)
    if kind == "ivf":
        quantizer = faiss.IndexFlatIP(dim)
        # faiss's Python wrapper keeps `quantizer` alive as long as the IVF index refers to it.
        return faiss.IndexIVFScalarQuantizer(quantizer, dim, ivf_lists(n), faiss.ScalarQuantizer.QT_8bit,
                                             faiss.METRIC_INNER_PRODUCT)
    if kind == "hnsw":
        idx = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
        idx.hnsw.efConstruction = 80
        return idx
    raise ValueError(f"unknown faiss index kind {kind!r}; choose one of {FAISS_KINDS}")


def build_faiss(kind: str, dim: int, n: int, chunks: Iterable[np.ndarray], train_sample: np.ndarray | None = None):
    """An index of ``kind`` holding the vectors of ``chunks`` (added one chunk at a time)."""
    idx = new_index(kind, dim, n)
    if not idx.is_trained:
        idx.train(np.ascontiguousarray(train_sample, dtype=np.float32))
    for c in chunks:
        idx.add(np.ascontiguousarray(c, dtype=np.float32))
    return idx


def flat_vectors(index_file) -> np.ndarray:
    """The [N, D] vectors stored in a flat FAISS file (for the torch index over Search-R1's file).

    The file is memory-mapped and the vectors copied out once (N x D x 4 bytes of host memory)."""
    faiss = import_faiss()

    idx = faiss.read_index(str(index_file), faiss.IO_FLAG_MMAP)
    if not isinstance(idx, faiss.IndexFlat):
        raise ValueError(f"{index_file} is a {type(idx).__name__}, not a flat index; "
                         "the torch index needs raw vectors")
    return faiss.rev_swig_ptr(idx.get_xb(), idx.ntotal * idx.d).reshape(idx.ntotal, idx.d).copy()


class FaissIndex:
    needs_text = False

    def __init__(self, index, kind: str, nprobe: int = 32, ef_search: int = 128):
        faiss = import_faiss()

        self.index, self.kind, self.dim = index, kind, index.d
        ivf = faiss.try_extract_index_ivf(index) if kind == "ivf" else None
        if ivf is not None:
            ivf.nprobe = min(nprobe, ivf.nlist)
        if kind == "hnsw":
            faiss.downcast_index(index).hnsw.efSearch = ef_search

    def __len__(self) -> int:
        return int(self.index.ntotal)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        scores, ids = self.index.search(np.ascontiguousarray(queries, dtype=np.float32), min(k, len(self)))
        return ids.astype(np.int64), scores.astype(np.float32)

    def write(self, out_dir: Path) -> None:
        faiss = import_faiss()

        faiss.write_index(self.index, str(Path(out_dir) / INDEX_FILE))

    @classmethod
    def load(cls, index_dir: Path, kind: str = "flat", gpu: bool = False, index_file: str | None = None,
             nprobe: int = 32, ef_search: int = 128, **_) -> FaissIndex:
        faiss = import_faiss()

        path = Path(index_file) if index_file else Path(index_dir) / INDEX_FILE
        # A flat index is read through a memory map: no second copy while it moves to the GPUs.
        flags = faiss.IO_FLAG_MMAP if kind == "flat" and gpu else 0
        index = faiss.read_index(str(path), flags)
        if gpu:
            index = to_gpus(index, kind)
        return cls(index, kind, nprobe=nprobe, ef_search=ef_search)


def gpu_available() -> bool:
    try:
        faiss = import_faiss()

        return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0
    except Exception:
        return False


def to_gpus(index, kind: str):
    """Move an index to all visible GPUs, sharded, stored in fp16 (faiss-gpu only)."""
    faiss = import_faiss()

    if kind == "hnsw":
        raise ValueError("HNSW indexes have no FAISS GPU version; use flat, ivf or the torch index on GPU")
    if not gpu_available():
        raise ValueError("FAISS GPU search needs faiss-gpu and a visible GPU (pip install faiss-gpu-cu12); "
                         "without it use --index-kind torch --device cuda, which needs no faiss-gpu")
    co = faiss.GpuMultipleClonerOptions()
    co.useFloat16 = True
    co.shard = True
    return faiss.index_cpu_to_all_gpus(index, co=co)
