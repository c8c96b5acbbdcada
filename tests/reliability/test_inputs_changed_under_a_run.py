"""Inputs that change under a run: a corpus rewritten under an in-process
retriever or a running server was a SIGBUS (exit 135, no message) because the corpus was
memory-mapped; now it is read, and a change is one line (the retriever then answers again once
the same rows are back). An index whose corpus changed since it was built is refused where it
loads (train before any model loads, eval, serve, search), and a build refused as "interrupted"
after a bad corpus row was fixed now starts again."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from mopd.cli import main
from tests.reliability.indexes import bm25_index, write_corpus
from tests.helpers.cli import one_line_error

ROWS = 200          # about 18 KB: the row searched for lies pages past the rewritten file's end


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MOPD_CACHE", str(tmp_path / "cache"))


@pytest.fixture()
def index(tmp_path):
    return bm25_index(tmp_path / "r", n=ROWS)




PROBE = textwrap.dedent("""
    import sys
    from mopd.retriever import HttpRetriever, RetrieverUnavailable, open_retriever
    from mopd.retriever.server import ServerThread

    index, corpus, mode = sys.argv[1:]
    r = open_retriever(index)
    srv = ServerThread(r).start() if mode == "server" else None
    search = HttpRetriever(srv.url, retries=0).search if srv else r.search
    assert search(["band 199"], 1)[0][0].id == "199"
    original = open(corpus, "rb").read()
    with open(corpus, "w") as f:                # rewritten in place, much shorter
        f.write('{"id": "0", "contents": "Other\\\\nanother corpus"}\\n')
    try:
        search(["band 199"], 1)
        print("NO ERROR")
    except RetrieverUnavailable as e:
        print("ERROR", type(e).__name__, str(e).replace("\\n", " | "))
    with open(corpus, "wb") as f:               # the same rows written again: it answers again
        f.write(original)
    print("AFTER", search(["band 199"], 1)[0][0].id)
    if srv:
        print("HEALTH", HttpRetriever(srv.url, retries=0).health()["status"])
        srv.stop()
""")


@pytest.mark.parametrize("mode", ["inprocess", "server"])
def test_a_corpus_rewritten_under_a_retriever_is_one_line_not_sigbus(index, tmp_path, mode):
    """In a fresh process: before the fix the search after the rewrite died of SIGBUS (-7)."""
    corpus = tmp_path / "r" / "corpus.jsonl"
    proc = subprocess.run([sys.executable, "-c", PROBE, str(index), str(corpus), mode], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "MOPD_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    out = proc.stdout.splitlines()
    error = next(line for line in out if line.startswith(("ERROR", "NO ERROR")))
    assert error.startswith("ERROR "), out
    assert "was modified while in use" in error and str(corpus) in error, error
    if mode == "inprocess":
        assert error.startswith("ERROR CorpusChanged")
    assert "AFTER 199" in out
    if mode == "server":
        assert "HEALTH ok" in out and "Traceback" not in proc.stderr


def test_a_changed_corpus_is_a_retriever_error_the_trainer_stops_on(index, tmp_path):
    """CorpusChanged is a RetrieverUnavailable (the trainer stops on it with a checkpoint, as on a
    server that went down) and a UserError (one line on the command line)."""
    from mopd.core.errors import UserError
    from mopd.retriever import RetrieverUnavailable, open_retriever
    from mopd.retriever.corpus import CorpusChanged

    r = open_retriever(index)
    corpus = tmp_path / "r" / "corpus.jsonl"
    with open(corpus, "a") as f:
        f.write(json.dumps({"id": "new", "contents": "Added\nrow"}) + "\n")
    with pytest.raises(CorpusChanged) as e:
        r.search(["band 7"], 2)
    assert isinstance(e.value, RetrieverUnavailable) and isinstance(e.value, UserError)
    assert "\n" not in str(e.value)


def test_a_corpus_replaced_by_rename_keeps_serving_the_rows_of_the_index(index, tmp_path):
    """The open file is the one the index was built from: its rows stay right."""
    from mopd.retriever import open_retriever

    r = open_retriever(index)
    corpus = tmp_path / "r" / "corpus.jsonl"
    other = write_corpus(tmp_path / "other.jsonl", 3, word="Choir")
    os.replace(other, corpus)
    assert [p.title for p in r.search(["band 150"], 1)[0]] == ["Band 150"]


def _edit_row(corpus, row=3):
    lines = corpus.read_text().splitlines(keepends=True)
    lines[row] = json.dumps({"id": str(row), "contents": "Band 3\nBand 3 was formed elsewhere."}) + "\n"
    corpus.write_text("".join(lines))


def test_an_index_whose_corpus_changed_since_it_was_built_is_refused_where_it_loads(
        index, tmp_path, capsys, tiny_model_dir, qa_file, monkeypatch):
    _edit_row(tmp_path / "r" / "corpus.jsonl")
    one_line_error(capsys, ["retriever", "search", "--index", str(index), "band"], "corpus mismatch")
    import mopd.retriever.server as server

    monkeypatch.setattr(server, "serve", lambda *a, **k: pytest.fail("serve started on a mismatched index"))
    one_line_error(capsys, ["retriever", "serve", "--index", str(index), "--port", "0"], "corpus mismatch")
    run = tmp_path / "run"
    one_line_error(capsys, ["train", "tiny_cmas_rl", f"model.path={tiny_model_dir}", f"data.train={qa_file}",
                       f"trainer.out_dir={run}", f"retriever.index={index}"], f"retriever.index={index}",
              "corpus mismatch")
    assert not run.exists()                     # refused in preflight, before anything is written
    one_line_error(capsys, ["eval", "run", "--model", tiny_model_dir, "--workflow", "cmas", "--manifest", qa_file,
                       "--out", str(tmp_path / "ev"), f"retriever.index={index}"], "corpus mismatch")


class _HashEncoder:
    """MiniLM's shape without its weights (the build's resume logic is probed, not the encoder)."""

    dim, device = 384, "cpu"

    def encode_passages(self, texts, on_batch=None):
        import numpy as np

        x = np.stack([np.random.default_rng(sum(t.encode())).standard_normal(self.dim) for t in texts])
        if on_batch is not None:
            on_batch(len(texts))
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("kind", ["bm25", "flat"])
def test_a_build_stopped_at_a_bad_row_builds_again_once_the_row_is_fixed(tmp_path, capsys, kind, monkeypatch):
    """It was refused as "an interrupted build with other settings (corpus_fingerprint differ)"."""
    import mopd.retriever.encoders as encoders

    monkeypatch.setattr(encoders, "load_encoder", lambda *a, **k: _HashEncoder())
    corpus = write_corpus(tmp_path / "corpus.jsonl", 12)
    good = corpus.read_text()
    lines = good.splitlines(keepends=True)
    lines[9] = '{"id": "9", "contents": 7}\n'
    corpus.write_text("".join(lines))
    out = tmp_path / kind
    out.mkdir()                                 # an existing --out: the CLI does not remove it on failure
    argv = ["retriever", "build-index", "--corpus", str(corpus), "--index-kind", kind, "--out", str(out),
            "--chunk-size", "4", "--device", "cpu"]
    one_line_error(capsys, argv, "row 9", progress=True)
    if kind == "flat":                          # two chunks were encoded before the bad row's
        assert len(list((out / "build").glob("chunk_*.npy"))) == 2
        other = write_corpus(tmp_path / "other.jsonl", 12, word="Choir")
        one_line_error(capsys, argv[:3] + [str(other)] + argv[4:], "interrupted build with other settings", progress=True)
    corpus.write_text(good)
    assert main(argv) == 0, capsys.readouterr().err
    assert "starting the build afresh" in capsys.readouterr().err
    from mopd.retriever import open_retriever

    if kind == "bm25":
        assert [p.title for p in open_retriever(out).search(["band 11"], 1)[0]] == ["Band 11"]
    assert not (out / "build").exists() and (out / "meta.json").is_file()
