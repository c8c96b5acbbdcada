"""Whether an index directory can answer from what it holds: its files against its ``meta.json``,
its corpus and its query encoder, each checked without reading the vectors (milliseconds, even
for wiki-18's 65 GB flat index).

Every index is checked like this when it opens (:class:`mopd.retriever.local.LocalRetriever`:
training, evaluation, ``retriever serve``, ``search``), and ``mopd train`` checks it before any
model loads (:func:`mopd.train.preflight.check_retriever`). Each finding is one line that names the
file and what to do: an :class:`IndexMismatch` when the index belongs to another corpus or encoder,
an :class:`IndexDirError` when a file is missing, truncated, of another dimension or another size.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mopd.retriever.corpus import Corpus, corpus_fingerprint
from mopd.retriever.encoders import ENCODERS
from mopd.retriever.index_errors import IndexDirError, IndexMismatch
from mopd.retriever.index_faiss import check_flat_size, read_header
from mopd.retriever.index_store import DENSE_KINDS, IndexMeta, check_compatible, check_kind, data_hash

REBUILD = "rebuild it with `mopd retriever build-index` (or import it again)"


def check_encoder_dim(meta: IndexMeta, index_dir) -> None:
    """A dense index's encoder is known and makes vectors of the index's dimension."""
    if meta.kind == "bm25":
        return
    if meta.encoder not in ENCODERS:
        raise IndexMismatch(f"{index_dir}/meta.json names encoder {meta.encoder!r}, which is not one of "
                            f"{sorted(ENCODERS)}")
    dim = ENCODERS[meta.encoder].dim
    if meta.dim != dim:
        raise IndexMismatch(f"{index_dir}/meta.json says dimension {meta.dim}, but encoder {meta.encoder!r} makes "
                            f"{dim}-dimensional vectors: the index is not of that encoder; {REBUILD}")


def check_corpus(meta: IndexMeta, index_dir, corpus_path: str | None = None) -> None:
    """The corpus file is the one the index was built from (its fingerprint), read without building
    its row table."""
    path = Path(corpus_path or meta.corpus_path).expanduser()
    if not path.is_file():
        Corpus(path)                     # its own one-line error (missing, ...)
    check_compatible(meta, index_dir, corpus_fingerprint=corpus_fingerprint(path), corpus_path=str(path))


def check_data_files(meta: IndexMeta, index_dir) -> None:
    """The index's data files exist, are complete, hold ``meta.num_passages`` entries of
    ``meta.dim`` dimensions, and are the files it was built with (``meta.data_hash``)."""
    index_dir = Path(index_dir)
    check_kind(meta.kind)
    if meta.kind in ("flat", "ivf", "hnsw"):     # (a flat file searched as torch too)
        _check_faiss_file(meta, Path(meta.index_file) if meta.index_file else index_dir / "index.faiss")
    elif meta.kind == "torch":
        _check_vectors(meta, index_dir / "vectors.npy")
    else:
        _check_bm25(meta, index_dir / "bm25")
    if meta.data_hash and data_hash(index_dir, meta) != meta.data_hash:
        raise IndexDirError(f"the data files of {index_dir} are not the ones it was built with (their contents "
                            "differ from what meta.json recorded: replaced or rewritten since); " + REBUILD)


def check_index(meta: IndexMeta, index_dir, corpus_path: str | None = None) -> None:
    """All of the above (what ``mopd train`` checks before a model loads)."""
    check_encoder_dim(meta, index_dir)
    check_data_files(meta, index_dir)
    check_corpus(meta, index_dir, corpus_path)


def check_opened(meta: IndexMeta, index_dir, index, corpus_rows: int) -> None:
    """An opened index holds ``meta.num_passages`` entries of ``meta.dim`` dimensions, each a row
    of the corpus (an index larger than its corpus would fail on every search that reaches past it)."""
    n = len(index)
    if n != meta.num_passages:
        raise IndexDirError(f"{index_dir} holds {n:,} entries but its meta.json says {meta.num_passages:,}: "
                            f"it is damaged or from another build; {REBUILD}")
    if n > corpus_rows:
        raise IndexMismatch(f"{index_dir} holds {n:,} entries but its corpus has {corpus_rows:,} rows; {REBUILD}")
    dim = getattr(index, "dim", 0)
    if meta.kind in DENSE_KINDS and dim != meta.dim:
        raise IndexDirError(f"{index_dir} holds {dim}-dimensional vectors but its meta.json says {meta.dim}; {REBUILD}")


def _check_faiss_file(meta: IndexMeta, path: Path) -> None:
    if not path.is_file():
        raise IndexDirError(f"{path} is missing: the index has no vectors; {REBUILD}")
    header = read_header(path)
    check_flat_size(header, path)
    if header.d != meta.dim or header.ntotal != meta.num_passages:
        raise IndexDirError(f"{path} holds {header.ntotal:,} vectors of dimension {header.d}, but the index's "
                            f"meta.json says {meta.num_passages:,} of dimension {meta.dim}: the file is from another "
                            f"index (another corpus or encoder); {REBUILD}")


def _check_vectors(meta: IndexMeta, path: Path) -> None:
    if not path.is_file():
        raise IndexDirError(f"{path} is missing: the index has no vectors; {REBUILD}")
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read(f)
            offset = f.tell()
    except (ValueError, OSError, SyntaxError) as e:
        raise IndexDirError(f"{path} is not a .npy array ({e}); {REBUILD}") from None
    need = offset + int(np.prod(shape)) * dtype.itemsize
    size = path.stat().st_size
    if size != need:
        raise IndexDirError(f"{path} is {size:,} bytes but its header ({shape} {dtype}) means {need:,}: the file is "
                            f"truncated or damaged; {REBUILD}")
    if tuple(shape) != (meta.num_passages, meta.dim):
        raise IndexDirError(f"{path} holds vectors of shape {tuple(shape)}, but the index's meta.json says "
                            f"({meta.num_passages}, {meta.dim}): the file is from another index; {REBUILD}")


BM25_JSON = ("params.index.json", "vocab.index.json", "vocab.tokenizer.json")
BM25_ARRAYS = ("data.csc.index.npy", "indices.csc.index.npy", "indptr.csc.index.npy")


def _check_bm25(meta: IndexMeta, d: Path) -> None:
    for name in BM25_JSON + BM25_ARRAYS:
        if not (d / name).is_file():
            raise IndexDirError(f"{d / name} is missing: the BM25 index is incomplete; {REBUILD}")
    for name in BM25_JSON:
        try:
            json.loads((d / name).read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise IndexDirError(f"{d / name} is not valid JSON ({e}): the file is truncated or damaged; "
                                f"{REBUILD}") from None
    for name in BM25_ARRAYS:
        try:
            np.load(d / name, mmap_mode="r")
        except (ValueError, OSError, EOFError) as e:
            raise IndexDirError(f"{d / name} cannot be read ({e}): the file is truncated or damaged; "
                                f"{REBUILD}") from None
    params = json.loads((d / "params.index.json").read_text(encoding="utf-8"))
    n = params.get("num_docs") if isinstance(params, dict) else None
    if n != meta.num_passages:
        raise IndexDirError(f"{d} indexes {n} passages, but the index's meta.json says {meta.num_passages:,}: "
                            f"the files are from another index; {REBUILD}")
