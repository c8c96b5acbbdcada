"""`mopd retriever build-index` on a bad corpus: one line, and no half-built directory."""

import pytest

from mopd.cli import main

BAD = [
    ("not json\n", "not valid JSON"),
    ("", "is empty"),
    ('{"id": "1"}\n', "needs a string field 'contents'"),
    (None, "does not exist"),
]


@pytest.mark.parametrize("text,message", BAD, ids=["not-json", "empty", "no-contents", "missing"])
def test_bad_corpus_leaves_nothing_behind(tmp_path, capsys, text, message):
    corpus = tmp_path / "corpus.jsonl"
    if text is not None:
        corpus.write_text(text)
    out = tmp_path / "index"
    assert main(["retriever", "build-index", "--corpus", str(corpus), "--index-kind", "bm25", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err
    assert not out.exists()


def test_an_existing_directory_is_left_alone(tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("not json\n")
    out = tmp_path / "index"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    assert main(["retriever", "build-index", "--corpus", str(corpus), "--index-kind", "bm25", "--out", str(out)]) == 2
    assert (out / "mine.txt").read_text() == "keep"
