"""`mopd retriever ...`: build-index, assemble, import-index, serve, search.

Handlers import what they run when they run (:mod:`mopd.cli` says why).
"""

from __future__ import annotations

import argparse
import sys


def register(sub) -> None:
    p = sub.add_parser("retriever", help="build retrieval indexes, serve them over HTTP, search them")
    rsub = p.add_subparsers(dest="retriever_command", metavar="ACTION")

    b = rsub.add_parser("build-index", help="encode a FlashRAG/Search-R1 jsonl corpus into an index directory "
                                            "(resumable: rerun the same command after an interruption)")
    b.add_argument("--corpus", default=None, help="corpus jsonl ({id, contents: 'title\\ntext'}); default: bundled")
    b.add_argument("--encoder", default="minilm", choices=["minilm", "e5"],
                   help="minilm (bundled, offline) or e5 (intfloat/e5-base-v2); ignored for bm25")
    b.add_argument("--encoder-path", default=None, help="local directory of the encoder's weights")
    b.add_argument("--index-kind", default="flat", choices=["flat", "ivf", "hnsw", "torch", "bm25"])
    b.add_argument("--out", required=True, help="index directory to create (or resume)")
    b.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: cuda when available)")
    b.add_argument("--batch-size", type=int, default=64, help="passages per encoder batch")
    b.add_argument("--chunk-size", type=int, default=8192, help="passages per on-disk chunk (resume granularity)")
    b.add_argument("--max-passages", type=int, default=None, help="index only the first N passages")
    b.add_argument("--overwrite", action="store_true", help="replace a different index or build in --out")
    b.add_argument("--encoder-devices", default=None, metavar="DEVICES",
                   help="encode on several devices at once, each chunk split over them: 'all' (every visible "
                        "GPU) or cuda:0,cuda:1 / 0,1 (default: one encoder, on --device)")
    b.set_defaults(func=_build)

    im = rsub.add_parser("import-index", help="adopt an existing FlashRAG/Search-R1 FAISS index (e.g. wiki-18 "
                                              "e5_Flat.index) without copying it")
    im.add_argument("--corpus", required=True, help="the corpus jsonl the index was built from (wiki-18.jsonl)")
    im.add_argument("--faiss-index", required=True, help="the FAISS file (e5_Flat.index)")
    im.add_argument("--encoder", default="e5", choices=["minilm", "e5"])
    im.add_argument("--encoder-path", default=None, help="local directory of the encoder's weights")
    im.add_argument("--out", required=True, help="index directory to create (holds metadata and row offsets)")
    im.set_defaults(func=_import)

    a = rsub.add_parser("assemble", help="concatenate Search-R1's index parts (part_aa, part_ab, ...) into "
                                         "e5_Flat.index and decompress wiki-18.jsonl.gz, checked",
                        description="Concatenate FOLDER's part_* files in name order into one FAISS file (refusing "
                                    "a gap in the part sequence), check its size against the parts and its header "
                                    "(faiss reads it; a flat index's size must be what its header says), "
                                    "checksums when --checksums is given, decompress the .jsonl.gz corpus beside "
                                    "it (the .gz is kept) and check one corpus line per vector. Outputs are "
                                    "written whole or not at all; a rerun reuses finished ones; a file at an "
                                    "output path that this command did not write is refused.")
    a.add_argument("folder", metavar="FOLDER", help="where the downloaded parts and wiki-18.jsonl.gz are")
    a.add_argument("--out", default=None, help="where to write the index and the corpus (default: FOLDER)")
    a.add_argument("--index-name", default="e5_Flat.index",
                   help="name of the assembled index (default e5_Flat.index; e5_HNSW64.index for the HNSW repo)")
    a.add_argument("--parts-prefix", default="part_", help="the parts' name prefix (default part_)")
    a.add_argument("--corpus-gz", default=None, help="the gzipped corpus's file name (default: FOLDER's one *.jsonl.gz)")
    a.add_argument("--checksums", default=None, metavar="FILE",
                   help="sha256sum/md5sum-style 'HASH  NAME' lines for the parts, the .gz or the outputs")
    a.set_defaults(func=_assemble)

    s = rsub.add_parser("serve", help="serve an index with Search-R1's HTTP API (POST /retrieve, GET /health)")
    s.add_argument("--index", default=None, help="index directory (default: the bundled corpus's MiniLM index)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    _search_options(s)
    s.add_argument("--topk", type=int, default=3, help="topk when a request gives none")
    s.add_argument("--max-topk", type=int, default=100)
    s.add_argument("--max-queries", type=int, default=1024, help="queries allowed in one request")
    s.add_argument("--max-results", type=int, default=8192,
                   help="queries x topk allowed in one request (bounds its work and answer size)")
    s.add_argument("--max-query-chars", type=int, default=2048, help="characters allowed in one query")
    s.add_argument("--max-body-mb", type=float, default=4.0, help="largest request body accepted")
    s.add_argument("--header-timeout", type=float, default=10.0, metavar="S",
                   help="close a connection that has not sent a whole request head S seconds after it opened or "
                        "was last answered (idle and slow clients)")
    s.add_argument("--body-timeout", type=float, default=30.0, metavar="S",
                   help="answer 408 to a request whose body has not arrived S seconds after its head")
    s.add_argument("--max-connections", type=int, default=0, metavar="N",
                   help="connections open at once; past it the longest-idle one is closed for each new one "
                        "(default 0: the open-file limit, raised to the hard limit, less 256)")
    s.add_argument("--token-file", default=None, metavar="FILE",
                   help="answer only requests carrying the token in FILE (Authorization: Bearer ...; clients: "
                        "retriever.token_file=FILE); for a server other machines reach (--host 0.0.0.0)")
    s.add_argument("--max-wait-ms", type=float, default=2.0, help="micro-batching: longest wait for more requests")
    s.add_argument("--max-batch", type=int, default=512, help="micro-batching: most queries per batch")
    s.add_argument("--slice-work", type=int, default=1024,
                   help="fairness: while a small request waits next to a big one, requests enter batches in slices "
                        "of at most this much work (queries x "
                        "longest query's characters), so a large request shares the worker with small ones "
                        "instead of holding them; larger: faster large requests, slower small ones")
    s.add_argument("--return-wait-ms", type=float, default=50.0,
                   help="fairness: after a batch that answered small requests, a slice of a big one waits up to "
                        "this long for their clients' next requests, so it runs with them rather than ahead of them")
    s.add_argument("--max-batch-work", type=int, default=4096,
                   help="most work (queries x longest query's characters) in one encoder + index call")
    s.add_argument("--no-batching", action="store_true", help="one encoder + index call per request")
    s.add_argument("--encoder-devices", default=None, metavar="DEVICES",
                   help="put a query encoder on each of these devices and split every batch of queries over "
                        "them: 'all' (every visible GPU, e.g. those --faiss-gpu shards the index over), or "
                        "cuda:0,cuda:1 / 0,1 (default: one encoder, on --device)")
    s.set_defaults(func=_serve)

    q = rsub.add_parser("search", help="search an index (or a server with --url) and print the passages")
    q.add_argument("queries", nargs="+")
    q.add_argument("--index", default=None, help="index directory (default: the bundled corpus's MiniLM index)")
    q.add_argument("--url", default=None, help="search a running server instead of an index directory")
    q.add_argument("-k", "--topk", type=int, default=3)
    _search_options(q)
    q.set_defaults(func=_search)


def _search_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--corpus", default=None, help="corpus path, when it moved since the index was built")
    p.add_argument("--encoder", default=None, help="query encoder; must be the index's (checked)")
    p.add_argument("--encoder-path", default=None, help="local directory of the encoder's weights")
    p.add_argument("--device", default=None, help="cpu, cuda (default: cuda when available)")
    p.add_argument("--search-kind", default=None, choices=["torch"],
                   help="torch: search a flat index's vectors with torch (GPU without faiss-gpu)")
    p.add_argument("--faiss-gpu", action="store_true", help="move a flat/IVF index to all GPUs (faiss-gpu, fp16)")


def _user_errors():
    from mopd.retriever import (
        CorpusError,
        EncoderUnavailable,
        IndexDirError,
        IndexMismatch,
        RetrieverUnavailable,
    )
    from mopd.retriever.client import RetrieverRequestError

    return (CorpusError, EncoderUnavailable, IndexDirError, IndexMismatch, RetrieverUnavailable, RetrieverRequestError)


def _run(fn):
    from mopd.core.errors import UserError

    try:
        return fn()
    except _user_errors() as e:
        raise UserError(str(e)) from None


def _open(args):
    from mopd.retriever import bundled_index, open_retriever

    retriever = open_retriever(args.index or bundled_index(progress=True), encoder=args.encoder,
                               corpus_path=args.corpus, encoder_path=args.encoder_path, device=args.device,
                               kind=args.search_kind, faiss_gpu=args.faiss_gpu)
    if getattr(args, "encoder_devices", None) and retriever.encoder is not None:
        from mopd.retriever.encoders import cuda_device_count, encoder_devices, replicate

        retriever.encoder = replicate(retriever.encoder, encoder_devices(args.encoder_devices, cuda_device_count()))
        print(f"query encoder on {retriever.encoder.device}", flush=True)
    return retriever


def _build(args) -> int:
    import shutil
    from pathlib import Path

    from mopd.core.errors import UserError
    from mopd.retriever import bundled_corpus_path
    from mopd.retriever.builder import IndexSpec, build_index

    devices = ()
    if args.encoder_devices:
        from mopd.retriever.encoders import cuda_device_count, encoder_devices

        devices = tuple(_run(lambda: encoder_devices(args.encoder_devices, cuda_device_count())))
    spec = IndexSpec(encoder=args.encoder, index_kind=args.index_kind, encoder_path=args.encoder_path,
                     device=args.device, chunk_size=args.chunk_size, batch_size=args.batch_size,
                     max_passages=args.max_passages, devices=devices)
    out = Path(args.out)
    fresh = not out.exists()
    try:
        _run(lambda: build_index(args.corpus or bundled_corpus_path(), out, spec, progress=True,
                                 overwrite=args.overwrite))
    except UserError:
        # A bad corpus or encoder found before any chunk was encoded: leave no half-built directory
        # (encoded chunks are kept: rerunning resumes from them).
        if fresh and out.is_dir() and not any((out / "build").glob("chunk_*.npy")):
            shutil.rmtree(out, ignore_errors=True)
        raise
    return 0


def _import(args) -> int:
    from mopd.retriever.importer import import_index

    out = _run(lambda: import_index(args.corpus, args.faiss_index, args.out, encoder=args.encoder,
                                    encoder_path=args.encoder_path, progress=True))
    print(f"imported: serve it with `mopd retriever serve --index {out}`")
    return 0


def _assemble(args) -> int:
    from mopd.retriever.assemble import assemble

    r = _run(lambda: assemble(args.folder, args.out, index_name=args.index_name, prefix=args.parts_prefix,
                              corpus_gz=args.corpus_gz, checksums=args.checksums, progress=True))
    for name in r.reused:
        print(f"{name}: already assembled, reused")
    if r.checked:
        print(f"checksums match: {', '.join(r.checked)}")
    if r.index is not None:
        print(f"index {r.index}: {r.vectors:,} vectors")
    if r.corpus is not None:
        print(f"corpus {r.corpus}: {r.rows:,} rows")
    if r.index is not None and r.corpus is not None:
        print(f"next: mopd retriever import-index --corpus {r.corpus} --faiss-index {r.index} --encoder e5 "
              "--out INDEX_DIR")
    return 0


def _serve(args) -> int:
    from mopd.core.errors import UserError
    from mopd.retriever.client import read_token, token_file_exposure
    from mopd.retriever.server import Batching, PortInUse, ServerLimits, check_port, serve

    if not 0 <= args.port <= 65535:
        raise UserError(f"--port {args.port} is not a TCP port (0-65535; 0 picks a free one)")
    for flag, value in (("--max-wait-ms", args.max_wait_ms), ("--return-wait-ms", args.return_wait_ms)):
        if not value >= 0:                    # NaN too
            raise UserError(f"{flag} {value}: a wait is 0 ms or more")
    try:
        limits = ServerLimits(default_topk=args.topk, max_topk=args.max_topk, max_queries=args.max_queries,
                              max_results=args.max_results, max_query_chars=args.max_query_chars,
                              max_body_bytes=int(args.max_body_mb * (1 << 20)), header_timeout_s=args.header_timeout,
                              body_timeout_s=args.body_timeout, max_connections=args.max_connections)
        token = read_token(args.token_file) if args.token_file else None
        exposed = token_file_exposure(args.token_file) if args.token_file else None
        if exposed:
            print(exposed, file=sys.stderr, flush=True)
        check_port(args.host, args.port)      # before the index loads (minutes for wiki-18)
    except (ValueError, PortInUse) as e:
        raise UserError(str(e)) from None
    if args.encoder_devices:                  # a wrong device is said before the index loads too
        from mopd.retriever.encoders import cuda_device_count, encoder_devices

        _run(lambda: encoder_devices(args.encoder_devices, cuda_device_count()))
    retriever = _run(lambda: _open(args))
    _run(retriever.self_check)                # never serve an index that would answer every request with 500
    try:
        batching = Batching(max_wait_ms=args.max_wait_ms, max_batch_queries=args.max_batch,
                            enabled=not args.no_batching, slice_work=args.slice_work,
                            max_batch_work=max(args.max_batch_work, args.slice_work),
                            return_wait_ms=args.return_wait_ms)
        serve(retriever, args.host, args.port, token=token, limits=limits, batching=batching)
    except OSError as e:                      # taken between the check and the bind
        raise UserError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
    return 0


def _search(args) -> int:
    from mopd.core.errors import UserError
    from mopd.retriever import HttpRetriever, format_passages

    if args.topk < 1:
        raise UserError(f"-k {args.topk}: ask for at least one passage per query (-k 1 or more)")

    def go():
        r = HttpRetriever(args.url, retries=1) if args.url else _open(args)
        return r.search(args.queries, args.topk)

    for q, passages in zip(args.queries, _run(go)):
        print(f"# {q}")
        print(format_passages(passages))
        print("  scores: " + ", ".join(f"{p.score:.4f}" for p in passages))
    return 0
