"""An index directory: its metadata, the compatibility checks, and opening it as a search object.

Layout of ``DIR`` (written by :func:`mopd.retriever.builder.build_index`)::

    meta.json              kind, encoder, dim, corpus path + fingerprint, passage count (written last)
    index.faiss            flat / ivf / hnsw           vectors.npy   torch (float32 [N, D])
    bm25/                  bm25                        *.offsets.npy row offsets of the corpus
    build/                 encoded chunks while a build runs (removed when it completes)

Every index object answers ``search(vectors_or_texts, k) -> (ids int64 [Q, k], scores float32
[Q, k])`` best first; ``needs_text`` says whether it takes query texts (BM25) or vectors.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Protocol

import numpy as np

from mopd.core.atomic import atomic_write_json
from mopd.core.fingerprint import file_sample_hash
from mopd.retriever.index_bm25 import BM25Index
from mopd.retriever.index_errors import IndexDirError, IndexMismatch
from mopd.retriever.index_faiss import FaissIndex
from mopd.retriever.index_torch import TorchIndex

META_FILE = "meta.json"
INDEX_DATA = ("index.faiss", "vectors.npy")
"""Index files inside an index directory (a BM25 index keeps its files under ``bm25/``)."""
FORMAT_VERSION = 1
DENSE_KINDS = ("flat", "ivf", "hnsw", "torch")
INDEX_KINDS = DENSE_KINDS + ("bm25",)


class SearchIndex(Protocol):
    kind: str
    needs_text: bool

    def search(self, queries: np.ndarray | Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]: ...

    def __len__(self) -> int: ...


@dataclass
class IndexMeta:
    kind: str
    encoder: str
    """Query encoder name ('' for bm25)."""
    dim: int
    corpus_path: str
    corpus_fingerprint: str
    num_passages: int
    encoder_path: str = ""
    """Explicit weights directory used at build time ('' = the encoder's default location)."""
    index_file: str = ""
    """A FAISS file outside the directory (an imported Search-R1/FlashRAG index); '' = DIR/index.faiss."""
    data_hash: str = ""
    """Sampled hash of the index's data files (:func:`data_hash`) when it was written; checked when
    it opens ('' in indexes written before it was recorded: not checked)."""
    created: str = ""
    format_version: int = FORMAT_VERSION

    def describe(self) -> str:
        enc = f"encoder {self.encoder} (dim {self.dim})" if self.encoder else "BM25"
        return f"{self.kind} index, {enc}, {self.num_passages} passages of {self.corpus_path}"


def check_kind(kind: str) -> None:
    if kind not in INDEX_KINDS:
        raise IndexDirError(f"unknown index kind {kind!r}; choose one of {list(INDEX_KINDS)}")


def write_meta(index_dir: Path, meta: IndexMeta) -> None:
    meta.created = meta.created or time.strftime("%Y-%m-%dT%H:%M:%S")
    atomic_write_json(Path(index_dir) / META_FILE, asdict(meta))


def read_meta(index_dir: Path) -> IndexMeta:
    p = Path(index_dir) / META_FILE
    if not p.is_file():
        hint = " (a build was interrupted: run the same build-index command again to resume)" \
            if (Path(index_dir) / "build").is_dir() else ""
        raise IndexDirError(f"{index_dir} is not a finished index directory: no {META_FILE}{hint}; build one "
                          "with `mopd retriever build-index` or `mopd retriever import-index`")
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
        known = {f.name for f in fields(IndexMeta)}
        meta = IndexMeta(**{k: v for k, v in raw.items() if k in known})
    except (json.JSONDecodeError, TypeError, AttributeError, UnicodeDecodeError) as e:
        raise IndexDirError(f"{p} is not valid index metadata: {e}") from None
    for name, typ in (("kind", str), ("encoder", str), ("dim", int), ("corpus_path", str),
                      ("corpus_fingerprint", str), ("num_passages", int), ("index_file", str), ("data_hash", str)):
        value = getattr(meta, name)
        if not isinstance(value, typ) or isinstance(value, bool):
            raise IndexDirError(f"{p} is not valid index metadata: {name} is {value!r}, not a {typ.__name__}")
    if meta.num_passages < 1 or meta.dim < 0:
        raise IndexDirError(f"{p} is not valid index metadata: {meta.num_passages} passages of dimension {meta.dim}")
    return meta


def data_files(index_dir, meta: IndexMeta) -> list[Path]:
    """The files that hold an index's data: ``index.faiss`` or ``vectors.npy``, an imported FAISS
    file, the files under ``bm25/`` (sorted)."""
    index_dir = Path(index_dir)
    files = [index_dir / name for name in INDEX_DATA if (index_dir / name).is_file()]
    if meta.index_file:
        files.append(Path(meta.index_file))
    bm25 = index_dir / "bm25"
    if bm25.is_dir():
        files += sorted(p for p in bm25.rglob("*") if p.is_file())
    return files


def file_lines(index_dir, files: Sequence[Path]) -> str:
    """``name\0sampled-hash`` lines of ``files`` (names relative to ``index_dir`` where inside it)."""
    index_dir = Path(index_dir)
    out = []
    for f in files:
        name = f.relative_to(index_dir).as_posix() if f.is_relative_to(index_dir) else f.name
        out.append(f"{name}\0{file_sample_hash(f) if f.is_file() else 'missing'}\n")
    return "".join(out)


def data_hash(index_dir, meta: IndexMeta) -> str:
    """32 hex digits of the index's data files' names and sampled contents (milliseconds, even for
    a 65 GB flat index: :func:`mopd.core.fingerprint.file_sample_hash`)."""
    return hashlib.sha256(file_lines(index_dir, data_files(index_dir, meta)).encode()).hexdigest()[:32]


def check_compatible(meta: IndexMeta, index_dir, encoder: str | None = None,
                     corpus_fingerprint: str | None = None, corpus_path: str | None = None) -> None:
    """Raise :class:`IndexMismatch` naming what differs: the query encoder or the corpus."""
    if encoder is not None and meta.kind != "bm25" and encoder != meta.encoder:
        raise IndexMismatch(f"query encoder mismatch: the index at {index_dir} was built with encoder "
                            f"{meta.encoder!r} (dim {meta.dim}), but queries would be encoded with {encoder!r}; "
                            f"use --encoder {meta.encoder} or rebuild the index")
    if corpus_fingerprint is not None and corpus_fingerprint != meta.corpus_fingerprint:
        raise IndexMismatch(f"corpus mismatch: the index at {index_dir} was built from {meta.corpus_path} "
                            f"(fingerprint {meta.corpus_fingerprint}), but the corpus {corpus_path or '?'} has "
                            f"fingerprint {corpus_fingerprint}; its rows would not match the index's vectors")


def open_index(index_dir: Path, meta: IndexMeta, kind: str | None = None, device: str | None = None,
               faiss_gpu: bool = False) -> SearchIndex:
    """Open the search structure of ``index_dir``. ``kind='torch'`` may also open a flat FAISS file
    (its vectors are read out and searched with torch, e.g. on a GPU without faiss-gpu)."""
    kind = kind or meta.kind
    check_kind(kind)
    if kind == "bm25" or meta.kind == "bm25":
        if kind != meta.kind:
            raise IndexDirError(f"{index_dir} holds a {meta.kind} index; it cannot be searched as {kind}")

        return BM25Index.load(index_dir)
    if kind == "torch":
        if meta.kind not in ("torch", "flat"):
            raise IndexDirError(f"the torch index needs raw vectors (a torch or flat index); {index_dir} is {meta.kind}")

        return TorchIndex.load(index_dir, device=device, index_file=meta.index_file or None)
    if kind != meta.kind:
        raise IndexDirError(f"{index_dir} holds a {meta.kind} index; it cannot be searched as {kind}")

    return FaissIndex.load(index_dir, kind=kind, gpu=faiss_gpu, index_file=meta.index_file or None)
