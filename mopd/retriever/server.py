"""A Search-R1-compatible retrieval server (aiohttp).

API (the same as Search-R1's ``retrieval_server.py``, so its clients work unchanged)::

    POST /retrieve  {"queries": ["...", ...], "topk": 3, "return_scores": true}
      -> {"result": [[{"document": {"id": "12", "contents": "title\\ntext"}, "score": 0.83}, ...], ...]}
         (with "return_scores": false, the default, each item is the bare document)
    GET /health     -> {"status": "ok", "index": ..., "fingerprint": ..., "requests": ..., "batches": ...,
                        "limits": ...}   (fingerprint: the index's, which training and evaluation runs record)

Concurrent requests are micro-batched, large ones a slice at a time (:mod:`mopd.retriever.batcher`),
so one large request cannot hold the others. The work of one request is bounded
(:class:`ServerLimits`: queries, topk, queries x topk, characters per query, body size). Every error
is JSON ``{"error": "..."}`` with a 4xx status for the client's mistakes (malformed, blank or
over-long queries, too much work, unknown paths and methods) and 500 for the server's; a malformed
request never reaches the batcher, so one bad client cannot stop others.

Connections are bounded too (:class:`ServerLimits`): a request head must arrive within
``header_timeout_s`` of a connection opening or being answered and its body within
``body_timeout_s`` (408), and at most :func:`connection_bound` connections stay open, the
longest-idle one closed for each new one past it (:class:`Connections`), so clients that connect
and send nothing cannot use up the process's files. With a shared token (:func:`require_token`)
a request without it is answered 401.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import hmac
import json
import logging
import resource
import signal
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Self

from aiohttp import web

from mopd.retriever.batcher import MicroBatcher
from mopd.retriever.client import check_token
from mopd.retriever.threads import ThreadsBySize

log = logging.getLogger(__name__)
BATCHER = web.AppKey("batcher", MicroBatcher)
SEARCH = web.AppKey("search", ThreadsBySize)
RESERVED_FILES = 256
"""Open files kept for the server's own use (index, corpus, libraries, threads) below the
open-file limit when the connection bound is derived from it."""
INLINE_RESULTS = 32
"""Answers of at most this many passages are built on the event loop: reading and serialising a
few rows costs less than the hand-off to an executor thread and back."""


@dataclass
class ServerLimits:
    """What one request may ask for (each excess is a 400/413 naming the limit)."""

    default_topk: int = 3
    """topk when a request gives none."""
    max_topk: int = 100
    """Largest topk a request may ask for."""
    max_queries: int = 1024
    """Queries in one request."""
    max_results: int = 8192
    """queries x topk of one request: bounds its index work and the size of its answer."""
    max_query_chars: int = 2048
    """Characters of one query. Encoders read at most 256 (MiniLM) or 512 (E5) tokens, so a longer
    query only costs tokenizer time (a 3 MB query took 6 s before this limit)."""
    max_body_bytes: int = 4 << 20
    """Largest request body (413 beyond it, before any parsing)."""
    header_timeout_s: float = 10.0
    """A connection that has not sent a whole request head this long after it opened (or after its
    last answer) is closed: idle and slow clients cannot hold connections."""
    body_timeout_s: float = 30.0
    """A request whose body has not arrived whole this long after its head is answered 408."""
    max_connections: int = 0
    """Connections open at once (0: the open-file limit, raised to its hard limit, less
    :data:`RESERVED_FILES`). At the bound the longest-idle connection is closed for each new one
    (one log line per minute says so), so a client that asks is answered."""

    def __post_init__(self):
        for name in ("default_topk", "max_topk", "max_queries", "max_results", "max_query_chars", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"ServerLimits.{name} must be >= 1")
        if not self.default_topk <= self.max_topk:
            raise ValueError("ServerLimits.default_topk must be <= max_topk")
        for name in ("header_timeout_s", "body_timeout_s"):
            if not getattr(self, name) > 0:       # NaN too
                raise ValueError(f"ServerLimits.{name} must be > 0")
        if self.max_connections < 0:
            raise ValueError("ServerLimits.max_connections must be >= 0 (0: from the open-file limit)")


LIMITS = web.AppKey("limits", ServerLimits)


@dataclass(frozen=True)
class Batching:
    """How the server gathers requests into searches: :class:`MicroBatcher`'s settings, waits in
    milliseconds (``mopd retriever serve``'s ``--max-wait-ms``, ``--max-batch``, ``--no-batching``,
    ``--slice-work``, ``--max-batch-work`` and ``--return-wait-ms``; :mod:`mopd.retriever.batcher`
    says what each does)."""

    max_wait_ms: float = 2.0
    max_batch_queries: int = 512
    enabled: bool = True
    slice_work: int = 1024
    max_batch_work: int = 4096
    max_whole_work: int | None = None
    return_wait_ms: float = 50.0

    def batcher(self, search) -> MicroBatcher:
        return MicroBatcher(search, self.max_wait_ms / 1000.0, self.max_batch_queries, enabled=self.enabled,
                            slice_work=self.slice_work, max_batch_work=self.max_batch_work,
                            max_whole_work=self.max_whole_work, return_wait_s=self.return_wait_ms / 1000.0)


class Connections:
    """A server's open connections, oldest first, and those being answered now.

    aiohttp has no bound on connections: each idle one holds a file descriptor until it times out,
    and at the process's open-file limit accepting stops, for well-behaved clients too (about 4,200
    idle connections stalled every search). :meth:`attach` hooks the aiohttp server's
    connection callbacks; past ``bound`` open connections each new one makes room by closing the
    longest-idle one (never one being answered)."""

    LOG_EVERY_S = 60.0

    def __init__(self):
        self.open: dict = {}      # request handler -> None, in the order the connections opened
        self.busy: set = set()    # handlers inside a request
        self.bound = 0
        self.closed_for_room = 0
        self._logged = -float("inf")

    def attach(self, server: web.Server, bound: int) -> None:
        self.bound = bound
        made, lost = server.connection_made, server.connection_lost

        def connection_made(handler, transport):
            made(handler, transport)
            self.open[handler] = None
            if len(self.open) > self.bound:
                self._make_room(handler)

        def connection_lost(handler, exc=None):
            lost(handler, exc)
            self.open.pop(handler, None)
            self.busy.discard(handler)

        server.connection_made, server.connection_lost = connection_made, connection_lost

    def _make_room(self, newest) -> None:
        victim = next((h for h in self.open if h not in self.busy and h is not newest), newest)
        self.open.pop(victim, None)
        victim.force_close()
        self.closed_for_room += 1
        now = time.monotonic()
        if now - self._logged >= self.LOG_EVERY_S:
            self._logged = now
            log.warning("%d connections open, the bound (--max-connections): closing the longest-idle one for "
                        "each new one (%d so far); clients that send nothing are closed after the header timeout",
                        len(self.open), self.closed_for_room)


CONNECTIONS = web.AppKey("connections", Connections)


class BadRequest(ValueError):
    pass


def parse_request(body: Any, limits: ServerLimits) -> tuple[list[str], int, bool]:
    """Validate a /retrieve body; returns (queries, topk, return_scores) or raises BadRequest."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object {\"queries\": [...], \"topk\": k, \"return_scores\": bool}")
    queries = body.get("queries")
    if queries is None:
        raise BadRequest("missing field 'queries' (a non-empty list of strings)")
    if not isinstance(queries, list):
        raise BadRequest(f"'queries' must be a list of strings, not {type(queries).__name__}")
    if not queries:
        raise BadRequest("'queries' is empty")
    if len(queries) > limits.max_queries:
        raise BadRequest(f"too many queries: {len(queries)} > {limits.max_queries} per request")
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise BadRequest(f"queries[{i}] is {type(q).__name__}; every query must be a string")
        if not q.strip():
            raise BadRequest(f"queries[{i}] is empty or blank; every query must have text")
        if len(q) > limits.max_query_chars:
            raise BadRequest(f"queries[{i}] has {len(q)} characters > {limits.max_query_chars} per query")
    topk = body.get("topk")
    if topk is None:
        topk = limits.default_topk
    if isinstance(topk, bool) or not isinstance(topk, int):
        raise BadRequest(f"'topk' must be an integer, not {topk!r}")
    if not 1 <= topk <= limits.max_topk:
        raise BadRequest(f"topk={topk} out of range [1, {limits.max_topk}]")
    if len(queries) * topk > limits.max_results:
        raise BadRequest(f"too much work: {len(queries)} queries x topk {topk} = {len(queries) * topk} results > "
                         f"{limits.max_results} per request; send fewer queries per request or a smaller topk")
    scores = body.get("return_scores", False)
    if not isinstance(scores, bool):
        raise BadRequest(f"'return_scores' must be true or false, not {scores!r}")
    return queries, topk, scores


def _error(status: int, msg: str, headers: dict | None = None):
    return web.json_response({"error": msg}, status=status, headers=headers)


@web.middleware
async def json_errors(request: web.Request, handler):
    """aiohttp's own errors (404, 405, ...) and unexpected failures as JSON, like ours."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        msg = f"{e.status} {e.reason}: {request.method} {request.path}"
        if e.status == 404:
            msg += " (the API is POST /retrieve and GET /health)"
        elif e.status == 405:
            msg += f" (allowed: {', '.join(sorted(getattr(e, 'allowed_methods', ()) or ()))})"
        headers = {"Allow": e.headers["Allow"]} if "Allow" in e.headers else None
        return _error(e.status, msg, headers)
    except ConnectionResetError as e:   # the client went away mid-request: nothing to answer, nothing broken
        log.warning("client %s hung up during %s %s (%s)", request.remote, request.method, request.path,
                    e.strerror or type(e).__name__)
        return _error(400, "the client closed the connection")
    except Exception as e:  # the server stays up and says what failed
        log.exception("unexpected error in %s %s", request.method, request.path)
        return _error(500, f"internal error: {type(e).__name__}: {e}")


def require_token(app: web.Application, token: str) -> None:
    """Answer only requests with ``Authorization: Bearer TOKEN`` (401 otherwise), for a server
    that other machines can reach (``--token-file``). ``token`` must be printable ASCII (ValueError
    otherwise: a header could not carry it). A header of any other bytes is a wrong token (401), never
    an error: it is compared only when it is ASCII, in constant time."""
    expected = f"Bearer {check_token(token, 'the server token')}".encode()

    @web.middleware
    async def token_check(request: web.Request, handler):
        sent = request.headers.get("Authorization", "")
        if not (sent.isascii() and hmac.compare_digest(sent.encode(), expected)):
            return _error(401, "missing or wrong token: this server needs the shared token (the client's "
                               "retriever.token_file)", headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    app.middlewares.append(token_check)


def _answer(retriever, ids, scores, with_scores: bool) -> bytes:
    result = []
    for row_i, row_s in zip(ids, scores, strict=True):
        docs = []
        for i, s in zip(row_i, row_s, strict=True):
            if i < 0:
                continue
            doc = retriever.corpus.document(int(i))
            docs.append({"document": doc, "score": float(s)} if with_scores else doc)
        result.append(docs)
    return json.dumps({"result": result}).encode()


def make_app(retriever, limits: ServerLimits | None = None, batching: Batching | None = None):
    """The aiohttp application serving ``retriever`` (a :class:`LocalRetriever`)."""
    limits = limits or ServerLimits()
    # A few queries encode faster on one torch thread (mopd.retriever.threads): the batcher's worker
    # is this process's only torch user.
    search = ThreadsBySize(retriever.search_rows)
    batcher = (batching or Batching()).batcher(search)

    async def retrieve(request: web.Request):
        try:
            raw = await asyncio.wait_for(request.read(), limits.body_timeout_s)
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"body too large: limit is {limits.max_body_bytes} bytes")
        except TimeoutError:
            return _error(408, f"the body did not arrive within {limits.body_timeout_s:g} s",
                          headers={"Connection": "close"})
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return _error(400, f"the body is not valid JSON: {e}")
        except RecursionError:
            return _error(400, "the body is not valid JSON for this API: nested too deeply")
        try:
            queries, topk, with_scores = parse_request(body, limits)
        except BadRequest as e:
            return _error(400, str(e))
        try:
            ids, scores = await batcher.submit(queries, topk)
            if ids.size <= INLINE_RESULTS:
                payload = _answer(retriever, ids, scores, with_scores)
            else:   # documents and JSON off the event loop: a large answer must not pause the other clients
                payload = await asyncio.get_running_loop().run_in_executor(
                    None, _answer, retriever, ids, scores, with_scores)
        except Exception as e:  # noqa: BLE001 (an index or corpus failure: the server stays up)
            # One line on the server's terminal too (a corpus rewritten under it, CorpusChanged: every
            # request fails until the corpus is restored, then it answers again).
            log.error("retrieval failed: %s: %s", type(e).__name__, e)
            return _error(500, f"retrieval failed: {type(e).__name__}: {e}")
        return web.Response(body=payload, content_type="application/json")

    fingerprint = getattr(retriever, "fingerprint", None)   # once: it reads the index files' samples

    async def health(request: web.Request):
        s = batcher.stats
        meta = retriever.meta
        return web.json_response({
            "status": "ok", "index": meta.describe(), "fingerprint": fingerprint, "kind": retriever.kind,
            "encoder": meta.encoder,
            "num_passages": len(retriever), "batching": batcher.enabled, "requests": s.requests,
            "queries": s.queries, "batches": s.batches, "largest_batch": s.largest_batch, "errors": s.errors,
            "sliced_requests": s.sliced_requests, "limits": dataclasses.asdict(limits)})

    async def on_startup(app):
        await batcher.start()

    async def on_cleanup(app):
        await batcher.stop()

    connections = Connections()

    @web.middleware
    async def answering(request: web.Request, handler):   # a connection inside a request is never closed for room
        connections.busy.add(request.protocol)
        try:
            return await handler(request)
        finally:
            connections.busy.discard(request.protocol)

    app = web.Application(client_max_size=limits.max_body_bytes, middlewares=[json_errors, answering])
    app[LIMITS] = limits
    app[CONNECTIONS] = connections
    app[BATCHER] = batcher
    app[SEARCH] = search
    app.router.add_post("/retrieve", retrieve)
    app.router.add_get("/health", health)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


class PortInUse(OSError):
    """The server's address is taken (checked before the index loads)."""


def check_port(host: str, port: int) -> None:
    """Raise :class:`PortInUse` if ``host:port`` cannot be bound now."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as aiohttp binds
        try:
            s.bind((host, port))
        except OSError as e:
            raise PortInUse(f"cannot listen on {host}:{port}: {e.strerror or e} (another server running? "
                            "choose another --port)") from None


def freeze_heap() -> int:
    """Exempt everything alive now (the loaded encoder, index, corpus offsets, the imported
    libraries: about 400k objects) from Python's cyclic garbage collector; returns how many.

    A full collection scans every tracked object. In a server holding torch and transformers that
    took 243 ms on the 2-core box, once every few seconds under load (the large answers' objects
    trigger it), and every request in flight waited for it: it was the small clients' p99 next to a
    large request (bench/RESULTS.md, "Against Search-R1's retrieval server"). Frozen objects are
    never collected, which costs nothing here: what the server loaded lives as long as it does.
    Call it once, after loading."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def raise_open_file_limit() -> int:
    """Raise this process's soft open-file limit to its hard limit; returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft if soft != resource.RLIM_INFINITY else 1 << 20
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return target
    except (ValueError, OSError):
        return soft


def connection_bound(limits: ServerLimits) -> int:
    """The connections the server keeps open at once: ``limits.max_connections``, at most the
    open-file limit (raised to the hard limit) less :data:`RESERVED_FILES`."""
    room = max(64, raise_open_file_limit() - RESERVED_FILES)
    return min(limits.max_connections, room) if limits.max_connections else room


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (0: a free port; ``getsockname`` says which)."""
    return socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                                backlog=1024)


async def start_server(app: web.Application, sock: socket.socket) -> web.AppRunner:
    """Serve ``app`` on ``sock`` with its connection limits: a request head must arrive within the
    header timeout of a connection opening or going idle (aiohttp's keep-alive timeout, which also
    runs from the connection's start), and at most :func:`connection_bound` connections stay open."""
    limits = app[LIMITS]
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=limits.header_timeout_s)
    await runner.setup()
    app[CONNECTIONS].attach(runner.server, connection_bound(limits))
    await web.SockSite(runner, sock).start()
    return runner


def serve(retriever, host: str = "127.0.0.1", port: int = 8000, token: str | None = None, **kwargs) -> None:
    """Serve until interrupted (the CLI's `mopd retriever serve`); prints the address it listens on
    (the real port for ``port=0``). ``token``: see :func:`require_token`; ``kwargs``: :func:`make_app`'s
    ``limits`` and ``batching``."""
    app = make_app(retriever, **kwargs)
    if token is not None:
        require_token(app, token)
    sock = listen(host, port)
    freeze_heap()

    async def forever():
        runner = await start_server(app, sock)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        limits, bound = app[LIMITS], app[CONNECTIONS].bound
        print(f"serving {retriever.meta.describe()} on http://{host}:{sock.getsockname()[1]} (POST /retrieve, "
              f"GET /health; at most {bound} connections, a request head within {limits.header_timeout_s:g} s"
              + (", token required)" if token is not None else ")"), flush=True)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    try:
        asyncio.run(forever())
    finally:
        # Frozen objects are skipped at exit too: extension modules then report them as leaked.
        gc.unfreeze()


class ServerThread:
    """The server on a background thread with its own event loop (tests, benchmarks, notebooks).
    Unlike :func:`serve`, it leaves the garbage collector alone (the process is someone else's):
    a benchmark that stands for ``mopd retriever serve`` calls :func:`freeze_heap` itself.

    ``with ServerThread(retriever) as srv: HttpRetriever(srv.url).search(...)``; port 0 = any free port;
    ``kwargs`` as :func:`serve`'s."""

    def __init__(self, retriever, host: str = "127.0.0.1", port: int = 0, token: str | None = None, **kwargs):
        self.retriever, self.host, self.port, self.kwargs, self.token = retriever, host, port, kwargs, token
        self.app = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="retrieval-server", daemon=True)
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _main(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)

        async def up():
            self.app = make_app(self.retriever, **self.kwargs)
            if self.token is not None:
                require_token(self.app, self.token)
            sock = listen(self.host, self.port)
            self.port = sock.getsockname()[1]
            self._runner = await start_server(self.app, sock)

        try:
            loop.run_until_complete(up())
        except BaseException as e:  # noqa: BLE001 (handed to the caller of start())
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(self._runner.cleanup())
        loop.close()

    def start(self) -> ServerThread:
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
