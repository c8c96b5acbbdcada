"""The retriever's shared token at its edges: an ``Authorization`` header of any bytes is a 401 (never
a 500 with a traceback in the server's log); a wrong or missing token is one line at the client
naming ``retriever.token_file``; a token file others can read is warned about when the server
starts; a token a header cannot carry (non-ASCII, control characters) is refused at start."""

import logging
import socket

import pytest

from mopd.cli import main
from mopd.config import RetrieverConfig
from mopd.retriever import HttpRetriever, open_retriever
from mopd.retriever.client import RetrieverUnavailable, read_token
from mopd.retriever.server import ServerThread
from mopd.train.preflight import PreflightError, check_retriever
from tests.reliability.indexes import bm25_index

TOKEN = "t0k-3n.Zq9"


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    return bm25_index(tmp_path_factory.mktemp("token"))


@pytest.fixture(scope="module")
def server(index):
    with ServerThread(open_retriever(index), token=TOKEN) as srv:
        yield srv


def _raw_request(url, authorization: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: " + authorization
                  + b"\r\n\r\n")
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize("authorization", [b"Bearer \xf6", b"Bearer \xff\xfe\x80", b"\xc3\xa9" * 7,
                                          b"Bearer " + TOKEN.encode() + b"\xf6", b"Bearer \xe2\x80\xae" + TOKEN.encode()])
def test_an_authorization_header_of_any_bytes_is_answered_401(server, authorization, caplog):
    with caplog.at_level(logging.DEBUG):
        answer = _raw_request(server.url, authorization)
    assert answer.startswith(b"HTTP/1.1 401"), answer[:300]
    assert TOKEN.encode() not in answer
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]
    assert _raw_request(server.url, b"Bearer " + TOKEN.encode()).startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("token_text", [None, "not-the-token"])
def test_a_wrong_or_missing_token_is_one_line_at_the_client_naming_the_setting(server, tmp_path, token_text):
    cfg = RetrieverConfig(kind="http", url=server.url)
    if token_text is not None:
        (tmp_path / "token").write_text(token_text + "\n")
        cfg.token_file = str(tmp_path / "token")
    with pytest.raises(PreflightError) as e:       # what `mopd train` says before a model loads
        check_retriever(cfg)
    assert "retriever.token_file" in str(e.value) and "401" in str(e.value) and "\n" not in str(e.value)
    assert TOKEN not in str(e.value)
    with pytest.raises(RetrieverUnavailable, match="retriever.token_file"):   # and during a run
        HttpRetriever.for_config(cfg).search(["band 4"], 2)


def test_an_unreadable_token_file_is_one_line_naming_the_setting(server, tmp_path):
    cfg = RetrieverConfig(kind="http", url=server.url, token_file=str(tmp_path / "missing"))
    with pytest.raises(PreflightError, match=r"retriever.token_file: token file .*missing"):
        check_retriever(cfg)


def _busy_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s


def test_a_token_file_others_can_read_is_warned_about_at_start(index, tmp_path, capsys):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    busy = _busy_port()     # the command stops at the port check, after reading the token
    try:
        for mode, who in ((0o644, "everyone"), (0o640, "its group"), (0o600, None)):
            token_file.chmod(mode)
            assert main(["retriever", "serve", "--index", str(index), "--token-file", str(token_file),
                         "--port", str(busy.getsockname()[1])]) == 2
            err = capsys.readouterr().err
            warned = [line for line in err.splitlines() if line.startswith("warning: token file")]
            if who is None:
                assert warned == [], err
            else:
                assert len(warned) == 1 and f"readable by {who}" in warned[0] and f"{mode:04o}" in warned[0], err
                assert TOKEN not in err
    finally:
        busy.close()


@pytest.mark.parametrize("token", ["tök€n", "ab\x01cd", "two words", "zero\u200bwidth"])
def test_a_token_a_header_cannot_carry_is_refused_at_start(index, tmp_path, capsys, token):
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n", encoding="utf-8")
    token_file.chmod(0o600)
    busy = _busy_port()     # were the token taken, the command would stop at the port (never serve)
    try:
        assert main(["retriever", "serve", "--index", str(index), "--token-file", str(token_file),
                     "--port", str(busy.getsockname()[1])]) == 2
    finally:
        busy.close()
    err = capsys.readouterr().err.strip()
    assert err.startswith("mopd retriever: error: token file") and "printable ASCII" in err and "\n" not in err
    with pytest.raises(ValueError, match="printable ASCII"):
        read_token(str(token_file))
    with pytest.raises(ValueError, match="printable ASCII"):
        ServerThread(open_retriever(index), token=token).__enter__()
