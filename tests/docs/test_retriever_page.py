"""mopd/retriever/README.md: its Python use of an index in-process, then its server (the bundled
corpus's index in wiki-18's place, on the CPU), asked as the page's HTTP section says."""

from __future__ import annotations

import json

import pytest

from tests.docs.runner import DocShell
from tests.docs.sequences import sequence

pytestmark = pytest.mark.slow


def test_the_retriever_page_searches_in_process_then_serves(tiny_assets, tmp_path):
    shell = DocShell(tmp_path / "work", tiny_assets)
    try:
        snippet, serve = sequence("retriever")
        assert snippet.lang == "python" and serve.text.startswith("mopd retriever serve")
        printed = shell.run(snippet)
        assert printed.startswith("Doc 1(Title: ") and "Doc 3(Title: " in printed
        shell.run(serve)
        health = json.loads(shell.get("/health"))
        assert health["status"] == "ok"
        bare = json.loads(shell.get("/retrieve", {"queries": ["who wrote the iliad"], "topk": 2}))
        assert [set(doc) >= {"id", "contents"} for doc in bare["result"][0]] == [True, True]   # bare documents
        scored = json.loads(shell.get("/retrieve", {"queries": ["a", "b", "c"], "topk": 3, "return_scores": True}))
        assert [len(r) for r in scored["result"]] == [3, 3, 3]
        assert all(isinstance(hit["score"], float) for r in scored["result"] for hit in r)
    finally:
        shell.stop_servers()
