"""Which retriever a run reads: the refusal of a run that names none, and the fingerprint of an index.

A training or evaluation run that retrieved from the bundled corpus (2,400 invented passages)
without being asked would give plausible numbers that mean nothing, so no retriever setting is an
error (:class:`NoRetriever`), and ``retriever.index=bundled`` asks for that corpus by name.

What a run records of its retriever (:func:`retriever_identity`): its kind, the index directory
(resolved) or the server's URL, and a fingerprint of the index: for an index directory, a hash of
its metadata (kind, encoder, dimension, corpus fingerprint, passage count) and sampled blocks of
its index files (:func:`mopd.core.fingerprint.file_sample_hash`: 17 blocks of 64 KiB of a 65 GB
flat index, milliseconds); for a server, the fingerprint the server reports of its own index on
``GET /health`` (``None`` for a server that reports none, e.g. Search-R1's own). A resume or a
continued evaluation whose retriever differs in any of these is refused as a changed setting.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from mopd.retriever import bundled
from mopd.retriever.bundled import BUNDLED_CORPUS
from mopd.retriever.client import HttpRetriever
from mopd.retriever.corpus import corpus_fingerprint
from mopd.retriever.index_store import IndexMeta, data_files, file_lines, read_meta

BUNDLED = "bundled"
"""The ``retriever.index`` value that asks for the bundled corpus's MiniLM flat index."""
NO_RETRIEVER = ("no retriever: set retriever.index=DIR (an index from `mopd retriever build-index` or "
                "`import-index`), or retriever.kind=http retriever.url=http://HOST:PORT (`mopd retriever "
                "serve`); retriever.index=bundled asks for the bundled corpus of 2,400 invented passages "
                "(a toy, for trying the tools out)")
META_KEYS = ("kind", "encoder", "dim", "corpus_fingerprint", "num_passages", "format_version")
"""What of ``meta.json`` names the index (not its paths or build time: a moved or rebuilt
identical index is the same index)."""


class NoRetriever(ValueError):
    """An in-process retriever without an index directory (the message says what to set)."""


def is_bundled(index: str) -> bool:
    return index.strip().lower() == BUNDLED


def index_fingerprint(index_dir, meta: IndexMeta | None = None) -> str:
    """32 hex digits naming an index directory's contents (see the module docstring)."""
    index_dir = Path(index_dir)
    meta = meta or read_meta(index_dir)
    h = hashlib.sha256(json.dumps({k: getattr(meta, k) for k in META_KEYS}, sort_keys=True).encode())
    h.update(file_lines(index_dir, data_files(index_dir, meta)).encode())
    return h.hexdigest()[:32]


def bundled_fingerprint() -> str:
    """The bundled index's fingerprint without building it: the corpus's content and the index spec
    it is always built with (MiniLM, flat)."""
    return hashlib.sha256(f"bundled-minilm-flat\0{corpus_fingerprint(BUNDLED_CORPUS)}".encode()).hexdigest()[:32]


def index_dir_of(cfg) -> Path:
    """The index directory ``cfg.index`` names (``bundled``: the cached bundled index, built on first
    use); :class:`NoRetriever` when it names none."""
    if not cfg.index.strip():
        raise NoRetriever(NO_RETRIEVER)
    if is_bundled(cfg.index):
        return bundled.bundled_index()
    return Path(cfg.index).expanduser()


def retriever_identity(cfg, health: dict | None = None) -> dict:
    """What a run records of the retriever ``cfg`` (a :class:`mopd.config.RetrieverConfig`) names:
    ``{"kind", "index" or "url", "fingerprint"}``. An HTTP retriever is asked for ``/health``
    (once, quickly) unless ``health`` is given. Raises :class:`NoRetriever` for no retriever,
    :class:`mopd.retriever.IndexDirError` for a directory that is not an index, and
    :class:`mopd.retriever.RetrieverUnavailable` for a server that does not answer."""
    if cfg.kind == "http":
        if health is None:
            health = HttpRetriever.for_config(cfg, quick=True).health()
        fp = health.get("fingerprint") if isinstance(health, dict) else None
        return {"kind": "http", "url": cfg.url.rstrip("/").removesuffix("/retrieve"), "fingerprint": fp}
    if not cfg.index.strip():
        raise NoRetriever(NO_RETRIEVER)
    if is_bundled(cfg.index):
        return {"kind": "inprocess", "index": BUNDLED, "fingerprint": bundled_fingerprint()}
    index_dir = Path(cfg.index).expanduser()   # read_meta refuses a directory that is not a finished index
    return {"kind": "inprocess", "index": str(index_dir.resolve()), "fingerprint": index_fingerprint(index_dir)}
