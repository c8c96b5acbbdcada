"""``mopd view --serve``: the written page over HTTP on 127.0.0.1 only (the page needs no server;
this is for a browser on another machine through an SSH tunnel)."""

from __future__ import annotations

import functools
import http.server
from pathlib import Path


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):   # noqa: A002 (the base class's name)
        pass


def page_server(page: Path, port: int = 8000) -> http.server.ThreadingHTTPServer:
    """A server of ``page``'s directory on 127.0.0.1:``port`` (0: any free port), not yet serving."""
    handler = functools.partial(_QuietHandler, directory=str(page.parent))
    return http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)


def serve(page: Path, port: int = 8000, say=print) -> None:
    """Serve ``page`` until Ctrl-C."""
    with page_server(page, port) as server:
        say(f"serving http://127.0.0.1:{server.server_address[1]}/{page.name} (Ctrl-C stops)")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            say("stopped")
