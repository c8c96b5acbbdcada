"""HTTP client of a Search-R1-compatible retrieval server (ours or Search-R1's / FlashRAG's).

Same interface as the in-process retriever: ``search(queries, k) -> list[list[Passage]]``. Each
request has a timeout; connection errors, timeouts and 5xx/429 answers are retried with exponential
backoff (``backoff_s * 2**attempt``, at most 10 s); after ``retries`` retries the client raises
:class:`RetrieverUnavailable` naming the URL. A 4xx answer is the caller's mistake and is raised at
once as :class:`RetrieverRequestError` with the server's message. Standard library only.

Requests respect the server's default limits: at most ``max_queries_per_request`` queries and
``max_results_per_request`` results (queries x k) each, queries cut to ``max_query_chars``
characters (the encoder reads fewer tokens than that anyway). A blank query gets no passages
without asking the server, which refuses blank queries.
"""

from __future__ import annotations

import json
import os
import stat
import time
import urllib.error
import urllib.request

from mopd.retriever.passage import Passage


class RetrieverUnavailable(RuntimeError):
    """The retrieval server could not be reached (or kept failing) after all retries."""


class RetrieverRequestError(ValueError):
    """The server rejected a request as malformed (HTTP 4xx)."""


class RetrieverTokenRefused(RetrieverUnavailable, RetrieverRequestError):
    """The server answered 401: no token, or not its token. Both a request error (4xx) and a server
    the run cannot use, so every caller that says either in one line says this one too."""


def check_token(token: str, where: str) -> str:
    """``token`` if it is printable ASCII (what an HTTP header carries intact), else ValueError
    naming ``where`` (the token itself is never said)."""
    bad = next((c for c in token if not " " < c < "\x7f"), None)
    if bad is not None:
        raise ValueError(f"{where}: the token holds {'a space' if bad == ' ' else f'the character U+{ord(bad):04X}'};"
                         " a token is printable ASCII without spaces (e.g. `openssl rand -hex 32`)")
    return token


def read_token(path: str) -> str:
    """The shared token in the file ``path`` (its first line), or ValueError saying what is wrong."""
    try:
        token = open(path, encoding="utf-8").read().strip().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"token file {path}: {getattr(e, 'strerror', None) or e}") from None
    if not token or not token[0].strip():
        raise ValueError(f"token file {path} is empty; put the shared token on its first line")
    return check_token(token[0].strip(), f"token file {path}")


def token_file_exposure(path: str) -> str | None:
    """A warning when the token file ``path`` is readable by its group or by everyone (None if not)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if not mode & (stat.S_IRGRP | stat.S_IROTH):
        return None
    who = "everyone" if mode & stat.S_IROTH else "its group"
    return (f"warning: token file {path} is readable by {who} (mode {stat.S_IMODE(mode):04o}); anyone who can "
            f"read it can search this server: chmod 600 {path}")


class HttpRetriever:
    def __init__(self, url: str = "http://127.0.0.1:8000", timeout_s: float = 30.0, retries: int = 5,
                 backoff_s: float = 0.5, max_queries_per_request: int = 512,
                 max_results_per_request: int = 8192, max_query_chars: int = 2048, token: str | None = None):
        # sent as Authorization: Bearer (a server started with --token-file)
        self.token = None if token is None else check_token(token, "the retriever client's token")
        self.url = url.rstrip("/")
        self.url = self.url.removesuffix("/retrieve")
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.max_queries_per_request = max_queries_per_request
        self.max_results_per_request = max_results_per_request
        self.max_query_chars = max_query_chars

    @classmethod
    def for_config(cls, cfg, quick: bool = False) -> HttpRetriever:
        """The client of a ``RetrieverConfig`` (kind=http), with its token file's token; ``quick``:
        one retry and at most 10 s, for a health check before a run."""
        token = None
        if cfg.token_file:
            try:
                token = read_token(cfg.token_file)
            except ValueError as e:
                raise RetrieverUnavailable(f"retriever.token_file: {e}") from None
        if quick:
            return cls(cfg.url, timeout_s=min(cfg.timeout_s, 10.0), retries=1, backoff_s=0.5, token=token)
        return cls(cfg.url, timeout_s=cfg.timeout_s, retries=cfg.retries, token=token)

    def __repr__(self) -> str:
        return f"HttpRetriever({self.url!r})"

    def _call(self, path: str, payload: dict | None = None) -> dict:
        url = self.url + path
        data = None if payload is None else json.dumps(payload).encode()
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(10.0, self.backoff_s * 2 ** (attempt - 1)))
            headers = {"Content-Type": "application/json"}
            if self.token is not None:
                headers["Authorization"] = f"Bearer {self.token}"
            req = urllib.request.Request(url, data=data, headers=headers, method="GET" if data is None else "POST")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    return json.loads(resp.read())
            except urllib.error.HTTPError as e:
                body = e.read().decode(errors="replace")[:500]
                if e.code == 401:
                    raise RetrieverTokenRefused(
                        f"{url} refused the request (HTTP 401): "
                        + ("it needs the token its server was started with (--token-file); give that file as "
                           "retriever.token_file" if self.token is None else
                           "the token sent is not the server's; retriever.token_file must name the file the server "
                           "was started with (--token-file)")) from None
                if e.code >= 500 or e.code == 429:
                    last = f"HTTP {e.code}: {body}"
                    continue
                raise RetrieverRequestError(f"{url} rejected the request (HTTP {e.code}): {body}") from None
            except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
                last = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
            except json.JSONDecodeError as e:
                last = f"the answer is not JSON ({e.msg})"
        raise RetrieverUnavailable(f"retrieval server {url} unavailable after {self.retries + 1} attempts "
                                   f"(timeout {self.timeout_s:g} s each): {last}. Is `mopd retriever serve` "
                                   "running at that address?")

    def health(self) -> dict:
        return self._call("/health")

    def index_fingerprint(self) -> str | None:
        """The fingerprint the server reports of its index on /health (None when it reports none)."""
        answer = self.health()
        return answer.get("fingerprint") if isinstance(answer, dict) else None

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        out: list[list[Passage]] = [[] for _ in queries]
        asked = [(i, q[:self.max_query_chars]) for i, q in enumerate(queries) if q.strip()]
        step = max(1, min(self.max_queries_per_request, self.max_results_per_request // max(k, 1)))
        for s in range(0, len(asked), step):
            part = asked[s:s + step]
            answer = self._call("/retrieve", {"queries": [q for _, q in part], "topk": k, "return_scores": True})
            result = answer.get("result") if isinstance(answer, dict) else None
            if not isinstance(result, list) or len(result) != len(part):
                raise RetrieverUnavailable(f"{self.url}/retrieve answered without one result list per query")
            for (i, _), r in zip(part, result, strict=True):
                try:
                    out[i] = parse_result(r)
                except BadAnswer as e:
                    raise RetrieverUnavailable(f"{self.url}/retrieve answered in a shape this client cannot read "
                                               f"({e}); is it a Search-R1-compatible retrieval server?") from None
        return out


class BadAnswer(ValueError):
    """A /retrieve result that is not a list of documents (or of {"document", "score"} items)."""


def parse_result(items: list) -> list[Passage]:
    """One query's result, with scores (``{"document", "score"}``) or bare documents; anything else
    is :class:`BadAnswer` naming the first item that is not one."""
    if not isinstance(items, list):
        raise BadAnswer(f"a query's result is {_short(items)}, not a list of documents")
    out = []
    for j, it in enumerate(items):
        if not isinstance(it, dict):
            raise BadAnswer(f"result item {j} is {_short(it)}, not a document object")
        doc, score = (it["document"], it.get("score", 0.0)) if "document" in it else (it, 0.0)
        if not isinstance(doc, dict):
            raise BadAnswer(f"result item {j}'s document is {_short(doc)}, not an object")
        contents = doc.get("contents")
        if contents is None:  # corpora stored as separate title / text fields
            title, text = doc.get("title", ""), doc.get("text")
            if text is None or not isinstance(title, str) or not isinstance(text, str):
                raise BadAnswer(f"result item {j}'s document has neither a string 'contents' nor 'title'/'text'")
            contents = f"{title}\n{text}"
        if not isinstance(contents, str):
            raise BadAnswer(f"result item {j}'s 'contents' is {_short(contents)}, not a string")
        if isinstance(score, bool) or not isinstance(score, (int, float)):
            raise BadAnswer(f"result item {j}'s score is {_short(score)}, not a number")
        out.append(Passage.from_contents(str(doc.get("id", "")), contents, float(score)))
    return out


def _short(value) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
