"""Adopt an existing FlashRAG / Search-R1 index (e.g. wiki-18's ``e5_Flat.index``) without copying it.

The new index directory holds only ``meta.json`` (pointing at the FAISS file by absolute path) and
the corpus's row-offset table; the 65 GB index and the 14 GB corpus stay where they are, and the
index is not read into RAM to import it (see :func:`_read_for_import`). Row i of the FAISS index is
line i of the corpus jsonl, as both projects build them.
"""

from __future__ import annotations

from pathlib import Path

from mopd.retriever import index_faiss
from mopd.retriever.corpus import Corpus
from mopd.retriever.encoders import ENCODERS
from mopd.retriever.index_errors import IndexDirError, IndexMismatch
from mopd.retriever.index_faiss import check_flat_size, check_memory, import_faiss, read_header
from mopd.retriever.index_store import IndexMeta, data_hash, write_meta


def faiss_kind(index) -> str:
    faiss = import_faiss()

    if isinstance(index, faiss.IndexFlat):
        if index.metric_type != faiss.METRIC_INNER_PRODUCT:
            raise IndexDirError("the FAISS index uses L2 distance; E5/MiniLM indexes use inner product")
        return "flat"
    if faiss.try_extract_index_ivf(index) is not None:
        return "ivf"
    if isinstance(index, faiss.IndexHNSW):
        return "hnsw"
    raise IndexDirError(f"unsupported FAISS index type {type(index).__name__}; flat, IVF and HNSW are supported")


def _read_for_import(faiss, path: Path, header):
    """The index object, read as cheaply as faiss allows: only its type, d and ntotal are needed.

    A flat index is memory-mapped where faiss can (IO_FLAG_MMAP_IFC); where it cannot, the header
    (read above, the size checked) stands in for it instead of reading 65 GB into RAM. IVF inverted
    lists are memory-mapped (IO_FLAG_MMAP); anything else is read whole if it fits in memory."""
    if header.flat:
        flag = index_faiss.mmap_flat_flag(faiss)      # looked up when called: tests stand in for it
        if flag is not None:
            return faiss.read_index(str(path), flag)
        stub = faiss.IndexFlat(header.d, header.metric_type)      # type, d, metric: what import needs
        stub.ntotal = header.ntotal
        return stub
    if header.fourcc.startswith("Iw"):
        return faiss.read_index(str(path), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
    check_memory(header.size, f"reading {path}")
    return faiss.read_index(str(path))


def import_index(corpus_path, faiss_index, out_dir, encoder: str = "e5", encoder_path: str | None = None,
                 progress: bool = False) -> Path:
    faiss = import_faiss()


    if encoder not in ENCODERS:
        raise IndexDirError(f"unknown encoder {encoder!r}; choose one of {sorted(ENCODERS)}")
    fpath = Path(faiss_index).expanduser().resolve()
    if not fpath.is_file():
        raise IndexDirError(f"FAISS index file {fpath} does not exist")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    header = read_header(fpath)
    if header.flat:
        check_flat_size(header, fpath)
    if progress:
        print(f"reading {fpath} ...", flush=True)
    index = _read_for_import(faiss, fpath, header)
    kind = faiss_kind(faiss.downcast_index(index))
    if index.d != ENCODERS[encoder].dim:
        raise IndexMismatch(f"query encoder mismatch: {fpath} holds {index.d}-dimensional vectors, but "
                            f"encoder {encoder!r} makes {ENCODERS[encoder].dim}-dimensional ones")
    if progress:
        print(f"indexing the rows of {corpus_path} (one pass over the file) ...", flush=True)
    corpus = Corpus(corpus_path, cache_dir=out)
    if len(corpus) != index.ntotal:
        raise IndexDirError(f"{fpath} holds {index.ntotal} vectors but {corpus.path} has {len(corpus)} rows; "
                            "they must come from the same build")
    meta = IndexMeta(kind=kind, encoder=encoder, dim=index.d, corpus_path=str(corpus.path.resolve()),
                     corpus_fingerprint=corpus.fingerprint, num_passages=len(corpus),
                     encoder_path=str(Path(encoder_path).resolve()) if encoder_path else "", index_file=str(fpath))
    meta.data_hash = data_hash(out, meta)
    write_meta(out, meta)
    return out

