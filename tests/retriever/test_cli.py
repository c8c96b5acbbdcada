import json

import pytest

from mopd.cli import main
from mopd.retriever import IndexMismatch, open_retriever
from mopd.retriever.importer import import_index


def test_build_index_and_search_from_the_command_line(small_corpus, tmp_path, capsys):
    out = tmp_path / "bm25"
    assert main(["retriever", "build-index", "--corpus", str(small_corpus), "--index-kind", "bm25",
                 "--out", str(out)]) == 0
    assert json.loads((out / "meta.json").read_text())["kind"] == "bm25"
    capsys.readouterr()
    assert main(["retriever", "search", "--index", str(out), "-k", "2", "copper market"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("# copper market\nDoc 1(Title: ") and "\nDoc 2(Title: " in printed


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert main(["retriever", "build-index", "--corpus", str(tmp_path / "none.jsonl"), "--out",
                 str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err
    assert main(["retriever", "search", "--index", str(tmp_path), "q"]) == 2
    assert "not a finished index directory" in capsys.readouterr().err
    assert main(["retriever", "search", "--url", "http://127.0.0.1:9", "q"]) == 2
    assert "http://127.0.0.1:9/retrieve unavailable" in capsys.readouterr().err


def test_import_an_existing_faiss_index(built, small_corpus, tmp_path, capsys):
    src = built("flat")
    out = tmp_path / "imported"
    assert main(["retriever", "import-index", "--corpus", str(small_corpus), "--faiss-index",
                 str(src / "index.faiss"), "--encoder", "minilm", "--out", str(out)]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["index_file"] == str((src / "index.faiss").resolve()) and not (out / "index.faiss").exists()
    qs = ["harbour town founded", "a composer"]
    assert open_retriever(out).search(qs, 3) == open_retriever(src).search(qs, 3)
    # the torch index can search the imported flat file too
    assert [p.id for p in open_retriever(out, kind="torch").search(qs, 3)[0]] == \
        [p.id for p in open_retriever(src).search(qs, 3)[0]]
    with pytest.raises(IndexMismatch, match="384-dimensional.*'e5'"):
        import_index(small_corpus, src / "index.faiss", tmp_path / "x", encoder="e5")
    short = tmp_path / "short.jsonl"
    short.write_text("".join(small_corpus.read_text().splitlines(True)[:10]))
    assert main(["retriever", "import-index", "--corpus", str(short), "--faiss-index", str(src / "index.faiss"),
                 "--encoder", "minilm", "--out", str(tmp_path / "y")]) == 2
    assert "160 vectors but" in capsys.readouterr().err
