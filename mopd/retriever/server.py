"""A Search-R1-compatible retrieval server (aiohttp).

API (the same as Search-R1's ``retrieval_server.py``, so its clients work unchanged)::

    POST /retrieve  {"queries": ["...", ...], "topk": 3, "return_scores": true}
      -> {"result": [[{"document": {"id": "12", "contents": "title\\ntext"}, "score": 0.83}, ...], ...]}
         (with "return_scores": false, the default, each item is the bare document)
    GET /health     -> {"status": "ok", "index": ..., "requests": ..., "batches": ...}

Concurrent requests are micro-batched (:mod:`mopd.retriever.batcher`). Malformed requests get a
4xx answer ``{"error": "..."}`` and never reach the batcher, so one bad client cannot stop others.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from mopd.retriever.batcher import MicroBatcher

BATCHER = web.AppKey("batcher", MicroBatcher)


@dataclass
class ServerLimits:
    default_topk: int = 3
    max_topk: int = 100
    max_queries: int = 1024
    max_body_bytes: int = 4 << 20


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
    topk = body.get("topk")
    if topk is None:
        topk = limits.default_topk
    if isinstance(topk, bool) or not isinstance(topk, int):
        raise BadRequest(f"'topk' must be an integer, not {topk!r}")
    if not 1 <= topk <= limits.max_topk:
        raise BadRequest(f"topk={topk} out of range [1, {limits.max_topk}]")
    scores = body.get("return_scores", False)
    if not isinstance(scores, bool):
        raise BadRequest(f"'return_scores' must be true or false, not {scores!r}")
    return queries, topk, scores


def make_app(retriever, limits: ServerLimits | None = None, max_wait_ms: float = 2.0,
             max_batch_queries: int = 512, batching: bool = True):
    """The aiohttp application serving ``retriever`` (a :class:`LocalRetriever`)."""
    limits = limits or ServerLimits()
    batcher = MicroBatcher(retriever.search_rows, max_wait_ms / 1000.0, max_batch_queries, enabled=batching)

    def error(status: int, msg: str):
        return web.json_response({"error": msg}, status=status)

    async def retrieve(request: web.Request):
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return error(413, f"body too large: limit is {limits.max_body_bytes} bytes")
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return error(400, f"the body is not valid JSON: {e}")
        try:
            queries, topk, with_scores = parse_request(body, limits)
        except BadRequest as e:
            return error(400, str(e))
        try:
            ids, scores = await batcher.submit(queries, topk)
            result = []
            for row_i, row_s in zip(ids, scores):
                docs = []
                for i, s in zip(row_i, row_s):
                    if i < 0:
                        continue
                    doc = retriever.corpus.document(int(i))
                    docs.append({"document": doc, "score": float(s)} if with_scores else doc)
                result.append(docs)
        except Exception as e:  # an index or corpus failure: the server stays up
            return error(500, f"retrieval failed: {type(e).__name__}: {e}")
        return web.json_response({"result": result})

    async def health(request: web.Request):
        s = batcher.stats
        meta = retriever.meta
        return web.json_response({
            "status": "ok", "index": meta.describe(), "kind": retriever.kind, "encoder": meta.encoder,
            "num_passages": len(retriever), "batching": batcher.enabled, "requests": s.requests,
            "queries": s.queries, "batches": s.batches, "largest_batch": s.largest_batch, "errors": s.errors})

    async def on_startup(app):
        await batcher.start()

    async def on_cleanup(app):
        await batcher.stop()

    app = web.Application(client_max_size=limits.max_body_bytes)
    app[BATCHER] = batcher
    app.router.add_post("/retrieve", retrieve)
    app.router.add_get("/health", health)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


def serve(retriever, host: str = "127.0.0.1", port: int = 8000, **kwargs) -> None:
    """Serve until interrupted (the CLI's `mopd retriever serve`)."""
    app = make_app(retriever, **kwargs)
    web.run_app(app, host=host, port=port, print=lambda msg: print(
        f"serving {retriever.meta.describe()} on http://{host}:{port} (POST /retrieve, GET /health)",
        flush=True), access_log=None)


class ServerThread:
    """The server on a background thread with its own event loop (tests, benchmarks, notebooks).

    ``with ServerThread(retriever) as srv: HttpRetriever(srv.url).search(...)``; port 0 = any free port."""

    def __init__(self, retriever, host: str = "127.0.0.1", port: int = 0, **kwargs):
        self.retriever, self.host, self.port, self.kwargs = retriever, host, port, kwargs
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
            self._runner = web.AppRunner(self.app, access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, self.host, self.port)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]

        try:
            loop.run_until_complete(up())
        except BaseException as e:
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

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
