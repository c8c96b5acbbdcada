"""Build an index directory from a corpus, resumably.

Dense kinds encode the corpus in chunks of ``chunk_size`` passages; each chunk's vectors go to
``DIR/build/chunk_NNNNNN.npy`` (written to a temporary name, then renamed, so a file that exists
is complete). A killed build, run again with the same arguments, skips the chunks on disk and
encodes the rest. When all chunks exist they are assembled into the index (FAISS adds them one
chunk at a time; the torch index concatenates them into one memory-mapped ``vectors.npy``), then
``meta.json`` is written (last: its presence marks a finished index) and ``build/`` is removed.

A file lock on ``DIR/.lock`` keeps two processes from building the same directory at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mopd.retriever import encoders
from mopd.retriever.corpus import Corpus
from mopd.retriever.encoders import ENCODERS
from mopd.retriever.index_bm25 import BM25Index
from mopd.retriever.index_errors import IndexDirError
from mopd.retriever.index_faiss import HNSW_M, TRAIN_SAMPLE, FaissIndex, build_faiss
from mopd.retriever.index_store import (
    DENSE_KINDS,
    META_FILE,
    IndexMeta,
    check_kind,
    data_hash,
    read_meta,
    write_meta,
)
from mopd.retriever.index_torch import VECTORS_FILE

log = logging.getLogger(__name__)
BUILD_DIR = "build"
PARAMS_FILE = "params.json"


@contextlib.contextmanager
def _dir_lock(out_dir: Path):
    with open(out_dir / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _chunk_path(build: Path, i: int) -> Path:
    return build / f"chunk_{i:06d}.npy"


def _say(msg: str, progress: bool) -> None:
    log.info(msg)
    if progress:
        print(msg, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class IndexSpec:
    """What index to build and how."""

    encoder: str = "minilm"
    """minilm (bundled, offline) or e5 (``encoder_path`` or the Hugging Face cache); ignored for bm25."""
    index_kind: str = "flat"
    """flat (FAISS inner product), torch, or bm25."""
    encoder_path: str | None = None
    """Local directory of the encoder's weights (e5)."""
    device: str | None = None
    """Encoder device (default: CUDA when available)."""
    chunk_size: int = 8192
    """Passages per encoded chunk; a killed build resumes at the first missing chunk."""
    batch_size: int = 64
    """Passages per encoder forward."""
    max_passages: int | None = None
    """Index only the first N rows of the corpus."""
    devices: tuple[str, ...] = ()
    """Encode on each of these devices at once, every chunk split over them (``encoder_devices``);
    empty: one encoder on ``device``. Not part of what makes two builds the same index."""


def build_index(corpus_path, out_dir, spec: IndexSpec = IndexSpec(), *, progress: bool = False,
                overwrite: bool = False) -> Path:
    """Build (or finish, or reuse) the index of ``corpus_path`` in ``out_dir``; returns ``out_dir``.

    A directory that already holds the same finished index is returned as it is; one holding a
    different index is an error unless ``overwrite``."""
    index_kind, encoder, chunk_size, max_passages = spec.index_kind, spec.encoder, spec.chunk_size, spec.max_passages
    encoder_path = spec.encoder_path
    check_kind(index_kind)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    enc_name = "" if index_kind == "bm25" else encoder
    enc_path = str(Path(encoder_path).expanduser().resolve()) if encoder_path and enc_name else ""
    with _dir_lock(out):
        corpus = Corpus(corpus_path, cache_dir=out)
        n = len(corpus) if max_passages is None else min(len(corpus), max_passages)
        params = {"kind": index_kind, "encoder": enc_name, "encoder_path": enc_path,
                  "corpus_path": str(corpus.path.resolve()), "corpus_fingerprint": corpus.fingerprint,
                  "num_passages": n, "chunk_size": chunk_size}
        same = ("kind", "encoder", "corpus_fingerprint", "num_passages")
        if (out / META_FILE).is_file():
            meta = read_meta(out)
            if not overwrite and all(getattr(meta, k) == params[k] for k in same):
                if meta.corpus_path != params["corpus_path"]:
                    # The same rows (same fingerprint) at another path: read them from here from now
                    # on. A shared cache (the bundled index) otherwise keeps the path of whichever
                    # checkout built it, and loading fails once that checkout is gone.
                    meta.corpus_path = params["corpus_path"]
                    write_meta(out, meta)
                _say(f"{out}: already holds this index ({meta.describe()})", progress)
                return out
            if not overwrite:
                raise IndexDirError(f"{out} already holds a different index ({meta.describe()}); choose another "
                                    "directory or pass --overwrite")
            _clear(out)
        build = out / BUILD_DIR
        if overwrite and build.exists():
            shutil.rmtree(build)
        build.mkdir(exist_ok=True)
        pfile = build / PARAMS_FILE
        if pfile.is_file():
            old = _read_params(pfile)
            if old != params:
                diff = [k for k in params if old.get(k) != params[k]]
                restart = _restart_reason(old, params, build, diff)
                if restart is None:
                    raise IndexDirError(f"{out} holds an interrupted build with other settings ({', '.join(diff)} "
                                        "differ); run it with the same arguments to resume, or pass --overwrite")
                _say(f"{out}: {restart}: starting the build afresh", progress)
                shutil.rmtree(build)
                build.mkdir()
        if index_kind != "bm25":
            _check_disk(out, build, index_kind, n, spec, progress)      # before the first file of the build
        if not pfile.is_file():
            pfile.write_text(json.dumps(params, indent=2))
        t0 = time.time()
        if index_kind == "bm25":
            _say(f"indexing {n} passages with BM25", progress)
            index = BM25Index.build(corpus.iter_contents(0, n), n)
            index.write(out)
            dim = 0
        else:
            dim = _encode_chunks(corpus, n, build, spec, enc_path or None, progress)
            _say(f"assembling the {index_kind} index from {_n_chunks(n, chunk_size)} chunks", progress)
            _assemble(index_kind, build, n, chunk_size, dim, out)
        meta = IndexMeta(kind=index_kind, encoder=enc_name, dim=dim, corpus_path=params["corpus_path"],
                         corpus_fingerprint=corpus.fingerprint, num_passages=n, encoder_path=enc_path)
        meta.data_hash = data_hash(out, meta)
        write_meta(out, meta)
        shutil.rmtree(build, ignore_errors=True)
        corpus.close()
        _say(f"built {index_kind} index of {n} passages in {out} ({time.time() - t0:.1f} s)", progress)
    return out


def _read_params(pfile: Path) -> dict:
    try:
        old = json.loads(pfile.read_text())
    except (ValueError, UnicodeDecodeError):
        return {}                                 # a params file cut by a kill: nothing to compare
    return old if isinstance(old, dict) else {}


def _restart_reason(old: dict, params: dict, build: Path, diff: list) -> str | None:
    """Why an interrupted build with other settings starts again instead of being refused, or None.

    Nothing encoded yet (a build stopped at a bad corpus row before its first chunk, or a BM25 build,
    which writes no chunks): nothing is lost. The same corpus file with other contents (a bad row
    fixed in place): the chunks encoded from the old contents cannot be resumed, the old contents
    being gone. Another corpus file or other settings with chunks on disk stay refused: a mistyped
    argument must not discard hours of encoding."""
    if not any(build.glob("chunk_*.npy")):
        return f"the interrupted build had encoded nothing ({', '.join(diff)} changed)"
    if set(diff) == {"corpus_fingerprint"} and old.get("corpus_path") == params["corpus_path"]:
        return (f"{params['corpus_path']} was edited since the interrupted build began, so its encoded chunks "
                "are of rows that are gone")
    return None


def human_bytes(n: float) -> str:
    """Decimal units, as disks are sold and ``df -H`` prints: 64559075328 -> '64.6 GB'."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError


def index_bytes(kind: str, n: int, dim: int) -> int:
    """Disk size of a finished dense index of ``n`` vectors: float32 vectors for flat and torch
    (n x dim x 4: wiki-18 with E5 is 21,015,324 x 768 x 4 = 64.6 GB), one byte per dimension plus an
    int64 id for IVF-SQ8, the vectors plus the base layer's 2 x M int32 links for HNSW."""
    if kind in ("flat", "torch"):
        return n * dim * 4
    if kind == "ivf":
        return n * (dim + 8)
    if kind == "hnsw":
        return n * (dim * 4 + 2 * HNSW_M * 4)
    raise ValueError(f"no size estimate for index kind {kind!r}")


def _check_disk(out: Path, build: Path, kind: str, n: int, spec: IndexSpec, progress: bool) -> None:
    """Say what the build will write, and refuse before encoding when the disk cannot hold it.

    Encoded chunks (float32, n x dim x 4 bytes in all) stay in ``build/`` until the index is
    assembled from them, so the peak is the chunks still to encode plus the finished index."""
    dim = ENCODERS[spec.encoder].dim
    total = _n_chunks(n, spec.chunk_size)
    todo = [i for i in range(total) if not _chunk_path(build, i).is_file()]
    chunk_rows = sum(min(spec.chunk_size, n - i * spec.chunk_size) for i in todo)
    chunks, final = chunk_rows * dim * 4, index_bytes(kind, n, dim)
    need = chunks + final
    free = shutil.disk_usage(out).free
    _say(f"build-index: {n:,} passages x {dim} dims x 4 B = {human_bytes(n * dim * 4)} of vectors; the {kind} index "
         f"takes {human_bytes(final)}, and while encoding {human_bytes(chunks)} of chunks wait in {build} (removed "
         f"at the end): {human_bytes(need)} needed, {human_bytes(free)} free", progress)
    if need > free:
        raise IndexDirError(f"build-index needs about {human_bytes(need)} free in {out} ({human_bytes(chunks)} of "
                            f"encoded chunks + the {human_bytes(final)} {kind} index) and it has {human_bytes(free)}; "
                            "free space or build on another disk")


def _clear(out: Path) -> None:
    for name in (META_FILE, "index.faiss", "vectors.npy"):
        (out / name).unlink(missing_ok=True)
    shutil.rmtree(out / "bm25", ignore_errors=True)
    shutil.rmtree(out / BUILD_DIR, ignore_errors=True)


def _n_chunks(n: int, chunk_size: int) -> int:
    return (n + chunk_size - 1) // chunk_size


def _encode_chunks(corpus: Corpus, n: int, build: Path, spec: IndexSpec, enc_path, progress: bool) -> int:
    enc_name, chunk_size = spec.encoder, spec.chunk_size

    total = _n_chunks(n, chunk_size)
    todo = [i for i in range(total) if not _chunk_path(build, i).is_file()]
    pending = set(todo)
    done_rows = sum(min(chunk_size, n - i * chunk_size) for i in range(total) if i not in pending)
    if todo and len(todo) < total:
        _say(f"resuming: {total - len(todo)} of {total} chunks already encoded in {build}", progress)
    if not todo:
        return ENCODERS[enc_name].dim
    # encoders.load_encoder and .replicate are looked up when called (tests stand in for them)
    encoder = encoders.load_encoder(enc_name, enc_path, spec.device, spec.batch_size)
    if spec.devices:
        encoder = encoders.replicate(encoder, spec.devices)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n, initial=done_rows, unit="passage", desc=f"encode {enc_name}", dynamic_ncols=True,
                   smoothing=0.05)
    first = _FirstBatch(n - done_rows, encoder.device, progress)
    lock = threading.Lock()          # replicas on several devices report from their threads

    def on_batch(k: int) -> None:
        with lock:
            first(k)
            if bar is not None:
                bar.update(k)

    try:
        first.start()
        for i in todo:
            lo, hi = i * chunk_size, min(n, (i + 1) * chunk_size)
            vecs = encoder.encode_passages(corpus.contents(range(lo, hi)), on_batch=on_batch)
            dst = _chunk_path(build, i)
            tmp = dst.with_name(dst.stem + ".tmp.npy")
            np.save(tmp, vecs.astype(np.float32))
            tmp.replace(dst)
    finally:
        if bar is not None:
            bar.close()
    return encoder.dim


class _FirstBatch:
    """After the first encoded batch, one line: its rate and the time the rest will take at it.

    A chunk's texts are encoded longest first, so the first batch is among the slowest (and it
    pays CUDA's start-up): the estimate errs long; the progress bar's own estimate follows."""

    def __init__(self, remaining: int, device: str, progress: bool):
        self.remaining, self.device, self.progress = remaining, device, progress
        self.t0: float | None = None
        self.done = False

    def start(self) -> None:
        self.t0 = time.perf_counter()

    def __call__(self, k: int) -> None:
        if self.done or self.t0 is None:
            return
        self.done = True
        dt = max(time.perf_counter() - self.t0, 1e-9)
        rest = (self.remaining - k) * dt / k
        msg = (f"first batch: {k} passages in {dt:.2f} s on {self.device} ({k / dt:,.0f} passages/s): about "
               f"{_duration(rest)} for the other {self.remaining - k:,} (longest texts first, so likely less)")
        log.info(msg)
        if self.progress:
            from tqdm import tqdm

            tqdm.write(msg, file=sys.stderr)      # above the progress bar, not into its line


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _chunks(build: Path, n: int, chunk_size: int) -> Iterator[np.ndarray]:
    for i in range(_n_chunks(n, chunk_size)):
        yield np.load(_chunk_path(build, i), mmap_mode="r")


def _train_sample(build: Path, n: int, chunk_size: int, max_rows: int, seed: int = 0) -> np.ndarray:
    """Up to ``max_rows`` vectors drawn uniformly from all chunks (IVF training data)."""
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(n, size=min(n, max_rows), replace=False))
    parts = []
    for i, c in enumerate(_chunks(build, n, chunk_size)):
        sel = rows[(rows >= i * chunk_size) & (rows < (i + 1) * chunk_size)] - i * chunk_size
        parts.append(np.asarray(c[sel]))
    return np.concatenate(parts)


def _assemble(kind: str, build: Path, n: int, chunk_size: int, dim: int, out: Path) -> None:
    assert kind in DENSE_KINDS
    if kind == "torch":
        tmp = out / (VECTORS_FILE + ".tmp.npy")
        vectors = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(n, dim))
        for i, c in enumerate(_chunks(build, n, chunk_size)):
            vectors[i * chunk_size:i * chunk_size + len(c)] = c
        vectors.flush()
        del vectors
        tmp.replace(out / VECTORS_FILE)
        return

    sample = _train_sample(build, n, chunk_size, TRAIN_SAMPLE) if kind == "ivf" else None
    index = build_faiss(kind, dim, n, _chunks(build, n, chunk_size), sample)
    FaissIndex(index, kind).write(out)
