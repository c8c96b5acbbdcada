"""`mopd view --serve` serves the page and nothing else: not the directory's listing, not the
records beside the page, not a symbolic link (beside it or put in its place), and only to requests
that name a loopback host (a DNS-rebinding page sends its own domain as Host and gets 421)."""

import http.client
import os
import threading

import pytest

from mopd.view.serve import host_is_loopback, page_server

PAGE = b"<!DOCTYPE html><title>the page</title>"


@pytest.fixture()
def served(tmp_path):
    page = tmp_path / "view.html"
    page.write_bytes(PAGE)
    (tmp_path / "records.jsonl").write_text('{"secret": 1}\n')
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "view.html").write_bytes(b"another")
    os.symlink("/etc/hostname", tmp_path / "host.html")
    server = page_server(page, 0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield page, server.server_address[1]
    server.shutdown()
    server.server_close()


def _get(port, path, host="127.0.0.1", method="GET"):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.putrequest(method, path, skip_host=True)
    if host is not None:
        conn.putheader("Host", host if ":" in host and not host.endswith("]") else f"{host}:{port}")
    conn.endheaders()
    answer = conn.getresponse()
    body = answer.read()
    conn.close()
    return answer.status, body, answer


def test_only_the_page_is_served(served):
    page, port = served
    status, body, answer = _get(port, "/view.html")
    assert status == 200 and body == PAGE
    assert "default-src 'none'" in answer.getheader("Content-Security-Policy")
    assert answer.getheader("X-Content-Type-Options") == "nosniff"
    assert _get(port, "/view.html?x=1#frag")[0] == 200 and _get(port, "/view%2Ehtml")[0] == 200
    for path in ("/", "/records.jsonl", "/host.html", "/sub/view.html", "/sub/", "/../view.html",
                 "/%2e%2e/etc/hostname", "//etc/hostname", "/view.html/", "/VIEW.HTML", "/view.html%00"):
        status, body, _ = _get(port, path)
        assert status == 404 and b"secret" not in body, (path, status, body)
    assert _get(port, "/view.html", method="POST")[0] == 405


def test_the_page_replaced_by_a_symlink_is_not_followed(served):
    page, port = served
    page.unlink()
    os.symlink("/etc/hostname", page)
    status, body, _ = _get(port, "/view.html")
    assert status == 404 and body.startswith(b"404")


@pytest.mark.parametrize("host", ["evil.example", "evil.example:80", "127.0.0.1.nip.io", "localhost.evil.example",
                                  "10.0.0.1", "[::2]", "127.0.0.2", "", None])
def test_a_foreign_host_header_is_refused(served, host):
    _, port = served
    status, body, _ = _get(port, "/view.html", host=host)
    assert status == 421 and PAGE not in body


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "LOCALHOST", "[::1]", "localhost:9000", "127.0.0.1:1"])
def test_a_loopback_host_on_any_port_is_answered(served, host):
    _, port = served       # an SSH tunnel may forward another local port: the port is not compared
    assert _get(port, "/view.html", host=host)[0] == 200


def test_host_check_by_hand():
    assert host_is_loopback("localhost.") and host_is_loopback("[::1]:8000")
    assert not host_is_loopback("localhost:80x") and not host_is_loopback("[::1]x") \
        and not host_is_loopback("evil.com:127.0.0.1")
