"""A client that hangs up in the middle of its request body is logged as one line, without a
traceback, and the server goes on answering."""

import json
import logging
import socket
import struct
import time
import urllib.request

from mopd.retriever import open_retriever
from mopd.retriever.server import Batching, ServerThread


def _index(tmp_path):
    from mopd.retriever import build_index
    from mopd.retriever.builder import IndexSpec

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f"Band {i}\nBand {i} was formed in town {i % 3}."})
                              + "\n" for i in range(12)))
    return build_index(corpus, tmp_path / "index", IndexSpec(index_kind="bm25"))


def _hang_up_mid_body(url: str) -> None:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)))
    s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: 100000\r\n\r\n" + b'{"queries": ["' + b"a" * 2000)
    time.sleep(0.2)                        # the server is now reading the body
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))   # close with a reset
    s.close()


def test_a_client_hang_up_is_one_log_line_and_the_server_stays_up(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("MOPD_CACHE", str(tmp_path / "cache"))
    with caplog.at_level(logging.DEBUG), \
            ServerThread(open_retriever(_index(tmp_path)), batching=Batching(max_wait_ms=5)) as srv:
        _hang_up_mid_body(srv.url)
        time.sleep(0.5)
        req = urllib.request.Request(srv.url + "/retrieve", data=json.dumps({"queries": ["band 4 formed"]}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200 and len(json.loads(r.read())["result"][0]) == 3
    tracebacks = [r for r in caplog.records if r.exc_info or r.exc_text]
    assert not tracebacks, [r.getMessage() for r in tracebacks]
    hangups = [r.getMessage() for r in caplog.records if "hung up" in r.getMessage()]
    assert len(hangups) == 1 and "\n" not in hangups[0] and "/retrieve" in hangups[0], hangups
