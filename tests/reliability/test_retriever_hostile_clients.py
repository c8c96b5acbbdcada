"""The retrieval server under clients that connect and send nothing, send slowly, or do not know
the token: idle and slow connections time out, open connections are bounded below the
open-file limit (the longest-idle one closed for a new one, said in one log line), so another
client's search is answered; `--port 0` prints the port it listens on; `--token-file` answers 401
without the token and the client sends it from ``retriever.token_file``."""

import json
import logging
import os
import re
import resource
import socket
import subprocess
import sys
import time

import pytest

from mopd.config import RetrieverConfig
from mopd.retriever import HttpRetriever, load_retriever, open_retriever
from mopd.retriever.client import RetrieverRequestError
from mopd.retriever.server import ServerLimits, ServerThread
from tests.reliability.indexes import bm25_index


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    return bm25_index(tmp_path_factory.mktemp("hostile"))


@pytest.fixture(scope="module")
def retriever(index):
    return open_retriever(index)


def _address(url):
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def _closed_by_server(sock, within_s=60.0) -> bool:
    """Whether the server closes ``sock`` (generous bound: never a timing assertion)."""
    sock.settimeout(within_s)
    try:
        data = sock.recv(65536)
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return data == b"" or data.startswith(b"HTTP/1.1 4")


def test_idle_and_slow_connections_are_closed_after_the_header_timeout(retriever):
    with ServerThread(retriever, limits=ServerLimits(header_timeout_s=0.5)) as srv:
        idle = socket.create_connection(_address(srv.url))
        slow = socket.create_connection(_address(srv.url))
        slow.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\n")     # a request head that never ends
        assert _closed_by_server(idle) and _closed_by_server(slow)
        idle.close(), slow.close()
        assert HttpRetriever(srv.url, retries=0).search(["band 4"], 2)[0]


def test_a_body_that_does_not_arrive_is_answered_408(retriever):
    with ServerThread(retriever, limits=ServerLimits(body_timeout_s=0.5)) as srv:
        s = socket.create_connection(_address(srv.url))
        s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n" + b'{"queries": [')
        s.settimeout(60)
        answer = s.recv(65536)
        s.close()
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"did not arrive within 0.5 s" in answer


def test_past_the_connection_bound_the_longest_idle_is_closed_and_others_are_answered(retriever, caplog):
    with caplog.at_level(logging.WARNING), \
            ServerThread(retriever, limits=ServerLimits(max_connections=16)) as srv:
        idle = [socket.create_connection(_address(srv.url)) for _ in range(48)]
        try:
            assert HttpRetriever(srv.url, retries=0, timeout_s=30).search(["band 4 formed"], 2)[0]
            assert _closed_by_server(idle[0])          # the oldest idle connections made room
        finally:
            for s in idle:
                s.close()
    bound = [r.getMessage() for r in caplog.records if "the bound" in r.getMessage()]
    assert len(bound) == 1 and "\n" not in bound[0], bound    # one line per minute, not one per connection


def test_a_server_with_a_token_answers_only_clients_that_send_it(retriever, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    with ServerThread(retriever, token="s3cret-token") as srv:
        with pytest.raises(RetrieverRequestError, match="HTTP 401.*token"):
            HttpRetriever(srv.url, retries=0).search(["band 4"], 2)
        with pytest.raises(RetrieverRequestError, match="HTTP 401"):
            HttpRetriever(srv.url, retries=0, token="wrong").health()
        client = load_retriever(RetrieverConfig(kind="http", url=srv.url, token_file=str(token_file)))
        assert client.search(["band 4"], 2)[0] and client.health()["status"] == "ok"


def _serve(index, *extra, soft_files=None):
    """`mopd retriever serve --port 0` in a fresh process; returns (process, its URL)."""
    def limit():
        if soft_files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft_files, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    proc = subprocess.Popen([sys.executable, "-m", "mopd", "retriever", "serve", "--index", str(index), "--port", "0",
                             *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=limit,
                            env=dict(os.environ, PYTHONPATH=os.getcwd()))
    line = proc.stdout.readline()
    m = re.search(r"on (http://127\.0\.0\.1:(\d+)) ", line)
    if m is None or int(m.group(2)) == 0:
        proc.kill()
        pytest.fail(f"the server did not say where it listens: {line!r} {proc.stderr.read()[-2000:]}")
    return proc, m.group(1)


@pytest.mark.slow
def test_port_0_prints_the_port_it_listens_on(index):
    proc, url = _serve(index)
    try:
        assert HttpRetriever(url, retries=0).health()["status"] == "ok"
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0


@pytest.mark.slow
def test_with_5000_idle_connections_another_client_is_still_answered(index):
    """As probed: the server started under an open-file limit of 4,096 (it raises it to the hard
    limit), 5,000 clients connect and send nothing, and another client searches. Before the fix that
    search was never answered (the server could accept no more connections); the seconds it takes
    are printed, not asserted (measured: 2-4 ms on the 2-core box)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 5600:
        pytest.skip(f"the open-file hard limit ({hard}) leaves no room for 5,000 connections")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))          # the test's own 5,000 sockets
    proc, url = _serve(index, "--header-timeout", "600", soft_files=4096)    # every one stays open
    idle = []
    try:
        idle = [socket.create_connection(_address(url)) for _ in range(5000)]
        client = HttpRetriever(url, retries=0, timeout_s=10)
        client.search(["band 1"], 2)                                   # a first search warms the index
        t = time.perf_counter()
        passages = client.search(["band 4 formed"], 3)
        seconds = time.perf_counter() - t
        print(json.dumps({"idle_connections": len(idle), "search_seconds": round(seconds, 4)}))
        assert passages[0] and len(passages[0]) == 3
    finally:
        for s in idle:
            s.close()
        proc.terminate()
        proc.wait(timeout=60)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
