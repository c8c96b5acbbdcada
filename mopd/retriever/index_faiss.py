"""FAISS indexes: flat inner product (exact, the default; Search-R1's ``e5_Flat.index``), IVF with
8-bit scalar quantisation (approximate, 4x less memory than flat), and HNSW (approximate, faster
search, somewhat more memory than flat). All use inner product on unit vectors (= cosine).

On a machine with faiss-gpu, flat and IVF indexes can be moved to all visible GPUs, sharded, with
fp16 storage (``gpu=True``): wiki-18's 65 GB fp32 flat index becomes 32 GB split over the GPUs.

Memory: ``faiss.IO_FLAG_MMAP`` maps only IVF inverted lists; a flat index read with it is still
copied into RAM (measured with faiss-cpu 1.15.1: resident memory grows by the file's size).
``IO_FLAG_MMAP_IFC`` (faiss >= 1.11) maps a flat index's vectors from the file instead: the pages
are the page cache's, shared and reclaimable (measured: anonymous memory unchanged, file-backed
pages grow only as searches touch them). Where faiss has no such flag, or for the other kinds,
reading an index that does not fit in ``MemAvailable`` is refused in one line with the RAM it needs.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mopd.retriever.index_errors import IndexDirError

log = logging.getLogger(__name__)
INDEX_FILE = "index.faiss"
GIB = 1 << 30


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


# A flat index file: fourcc, d (int32), ntotal (int64), two unused int64, is_trained (1 byte),
# metric_type (int32), metric_arg (float32, only when metric_type > 1), then the vectors as a
# vector<float>: its length (uint64, = ntotal * d) and ntotal * d float32 values.
FLAT_FOURCCS = {b"IxFI": "flat inner product", b"IxF2": "flat L2", b"IxFl": "flat"}
_HEAD = struct.Struct("<4siqqq?i")


@dataclass(frozen=True)
class FaissHeader:
    """What the first bytes of a FAISS file say, read without faiss and without reading the rest."""

    fourcc: str
    d: int
    ntotal: int
    metric_type: int
    size: int
    """The file's size in bytes."""
    expected_size: int | None
    """For a flat index, the size its header implies (None for other kinds)."""

    @property
    def flat(self) -> bool:
        return self.fourcc.encode() in FLAT_FOURCCS


def read_header(path) -> FaissHeader:
    """The header of FAISS file ``path`` (any index kind: fourcc, d, ntotal, metric)."""
    p = Path(path)
    size = p.stat().st_size
    with open(p, "rb") as f:
        head = f.read(_HEAD.size + 12)
    if len(head) < _HEAD.size:
        raise IndexDirError(f"{p} is {size} bytes: too short to be a FAISS index")
    fourcc, d, ntotal, _, _, _, metric = _HEAD.unpack_from(head)
    try:
        name = fourcc.decode("ascii")
    except UnicodeDecodeError:
        name = ""
    if not name.isprintable() or len(name) != 4 or d <= 0 or ntotal < 0:
        raise IndexDirError(f"{p} does not start with a FAISS index header (first bytes {head[:8]!r})")
    expected = None
    if fourcc in FLAT_FOURCCS:
        at = _HEAD.size + (4 if metric > 1 else 0)
        (stored,) = struct.unpack_from("<Q", head, at) if len(head) >= at + 8 else (None,)
        if stored is not None and stored != ntotal * d:
            raise IndexDirError(f"{p}: the header says {ntotal} vectors of dimension {d}, but its vector block "
                                f"holds {stored} floats, not {ntotal * d}: not a complete flat index")
        expected = at + 8 + 4 * ntotal * d
    return FaissHeader(name, d, ntotal, metric, size, expected)


def check_flat_size(header: FaissHeader, path) -> None:
    """A flat index's file is exactly as long as its header says (a missing or extra part shows here)."""
    if header.expected_size is not None and header.size != header.expected_size:
        raise IndexDirError(f"{path} is {header.size:,} bytes but its header ({header.ntotal:,} vectors of "
                            f"dimension {header.d}) means {header.expected_size:,}: the file is incomplete or has "
                            "extra bytes (a part missing, truncated or repeated?)")


def mem_available() -> int | None:
    """``MemAvailable`` of /proc/meminfo in bytes (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_memory(need: int, what: str) -> None:
    """Refuse, in one line, to read ``need`` bytes into RAM when ``MemAvailable`` is smaller."""
    avail = mem_available()
    if avail is not None and need > avail:
        raise IndexDirError(f"{what} needs about {need / GIB:.1f} GiB of RAM and this machine has "
                            f"{avail / GIB:.1f} GiB available (MemAvailable); free memory, use a larger machine, "
                            "or, for a flat index, a faiss with IO_FLAG_MMAP_IFC (faiss >= 1.11) maps it instead")


def mmap_flat_flag(faiss) -> int | None:
    """faiss's flag that memory-maps a flat index's vectors, or None where this faiss has none."""
    return getattr(faiss, "IO_FLAG_MMAP_IFC", None)


def read_index_file(path, purpose: str = "reading"):
    """Read a FAISS file: a flat index memory-mapped where faiss can (no copy in RAM), else read
    whole after checking that it fits in the memory available."""
    faiss = import_faiss()

    p = Path(path)
    header = read_header(p)
    check_flat_size(header, p)          # a truncated flat file, mapped, would fault on the first search
    flag = mmap_flat_flag(faiss) if header.flat else None
    if flag is not None:
        avail = mem_available()
        if avail is not None and header.size > avail:
            log.warning("%s (%.1f GiB) is memory-mapped but larger than the memory available (%.1f GiB): "
                        "searches read it from disk until the page cache holds it", p, header.size / GIB,
                        avail / GIB)
        return _read(faiss, p, flag)
    how = "" if header.flat else f" (a {header.fourcc} index is read whole)"
    check_memory(header.size, f"{purpose} {p}{how}")
    return _read(faiss, p)


def _read(faiss, path: Path, *flags):
    """``faiss.read_index``, its failure (a truncated or damaged file) one line naming the file."""
    try:
        return faiss.read_index(str(path), *flags)
    except RuntimeError as e:
        reason = next((ln.strip() for ln in str(e).splitlines() if "Error" in ln or "error" in ln),
                      str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__)
        raise IndexDirError(f"faiss cannot read {path} ({reason[:200]}): the file is truncated or damaged; "
                            "rebuild the index") from None


def flat_vectors(index_file) -> np.ndarray:
    """The [N, D] vectors stored in a flat FAISS file (for the torch index over Search-R1's file).

    The file is memory-mapped where faiss can, and the vectors copied out once (N x D x 4 bytes of
    host memory, checked against the memory available first)."""
    faiss = import_faiss()

    header = read_header(index_file)
    if not header.flat:
        raise ValueError(f"{index_file} is a {header.fourcc} index, not a flat index; "
                         "the torch index needs raw vectors")
    need = 4 * header.ntotal * header.d
    check_memory(need if mmap_flat_flag(faiss) is not None else 2 * need,
                 f"copying the vectors of {index_file} for the torch index")
    idx = read_index_file(index_file)
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
        path = Path(index_file) if index_file else Path(index_dir) / INDEX_FILE
        # A flat index is memory-mapped where faiss can: no copy in RAM, and none while it moves to
        # the GPUs; otherwise (and for IVF/HNSW) it is read whole if it fits in the memory available.
        index = read_index_file(path, "loading the index")
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
