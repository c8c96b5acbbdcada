"""``mopd view --serve``: the written page over HTTP on 127.0.0.1 only (the page needs no server;
this is for a browser on another machine through an SSH tunnel)."""

from __future__ import annotations

import functools
import http.server
from pathlib import Path


def serve(page: Path, port: int = 8000, say=print) -> None:
    """Serve ``page``'s directory on 127.0.0.1:``port`` until Ctrl-C."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(page.parent))
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as server:
        say(f"serving http://127.0.0.1:{server.server_address[1]}/{page.name} (Ctrl-C stops)")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            say("stopped")
