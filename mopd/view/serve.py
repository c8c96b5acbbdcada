"""``mopd view --serve``: the written page over HTTP on 127.0.0.1 only (the page needs no server;
this is for a browser on another machine through an SSH tunnel).

It serves the page and nothing else: ``GET /<page name>``; any other path (``/`` too) is 404 (no directory listing, not the records beside the page). The page is opened without
following a symbolic link (``O_NOFOLLOW``): a link put in its place is 404 too. A request whose
``Host`` header is not a loopback name for this server (``127.0.0.1``, ``localhost``, ``[::1]``;
any port, since an SSH tunnel may forward another one) is answered 421: a web page that rebinds its
own domain to 127.0.0.1 (DNS rebinding) sends its own domain as ``Host`` and so cannot read the page.
Every answer forbids the browser to load anything else (Content-Security-Policy) and to sniff
types; only GET and HEAD are answered.
"""

from __future__ import annotations

import http.server
import os
import re
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

HOST = "127.0.0.1"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


_HOST = re.compile(r"(\[[0-9a-f:.]+\]|[^:\[\]]+)(?::\d{1,5})?")


def host_is_loopback(host: str | None) -> bool:
    """Whether a ``Host`` header names this machine's loopback address (any port)."""
    m = _HOST.fullmatch((host or "").strip().lower())
    return bool(m) and m.group(1).rstrip(".") in LOOPBACK_NAMES


def _read_page(page: Path) -> bytes | None:
    """The page's bytes, or None if it is gone or is (now) a symbolic link."""
    try:
        fd = os.open(page, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read()


def page_handler(page: Path) -> type:
    """A request handler class that answers ``page`` only (see the module)."""
    name = "/" + page.name

    class PageHandler(http.server.BaseHTTPRequestHandler):
        server_version = "mopd-view"
        sys_version = ""

        def log_message(self, format, *args):   # noqa: A002 (the base class's name)
            pass

        def _answer(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Content-Security-Policy", CSP)
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Referrer-Policy", "no-referrer")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self):   # noqa: N802 (the base class's name)
            if not host_is_loopback(self.headers.get("Host")):
                return self._answer(421, b"421: this server answers only requests for 127.0.0.1 or localhost\n")
            body = _read_page(page) if unquote(urlsplit(self.path).path) == name else None
            if body is None:
                return self._answer(404, b"404: this server serves only " + quote(name).encode() + b"\n")
            return self._answer(200, body, "text/html; charset=utf-8")

        do_HEAD = do_GET

        def _refuse(self):
            self._answer(405, b"405: only GET and HEAD\n")

        do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse

    return PageHandler


def page_server(page: Path, port: int = 8000) -> http.server.ThreadingHTTPServer:
    """A server of ``page`` alone on 127.0.0.1:``port`` (0: any free port), not yet serving."""
    return http.server.ThreadingHTTPServer((HOST, port), page_handler(Path(page)))


def serve(page: Path, port: int = 8000, say=print) -> None:
    """Serve ``page`` until Ctrl-C."""
    with page_server(page, port) as server:
        say(f"serving http://{HOST}:{server.server_address[1]}/{quote(page.name)} (only this page; Ctrl-C stops)")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            say("stopped")
