"""Shared fixtures: small indexes over the first passages of the bundled corpus, built once."""

import json
from pathlib import Path

import pytest

from mopd.retriever import bundled_corpus_path

N_SMALL = 160  # passages in the session indexes (about 3 s of MiniLM encoding on 2 cores)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Derived files (offset tables, the bundled index) go to a per-session temporary cache."""
    monkeypatch.setenv("MOPD_CACHE", str(tmp_path_factory.getbasetemp() / "mopd_cache"))


@pytest.fixture(scope="session")
def bundled_rows():
    with open(bundled_corpus_path()) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory, bundled_rows) -> Path:
    """The first N_SMALL bundled passages as their own corpus file."""
    p = tmp_path_factory.mktemp("corpus") / "small.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in bundled_rows[:N_SMALL]))
    return p


@pytest.fixture(scope="session")
def built(tmp_path_factory, small_corpus):
    """Index directories of the small corpus, built lazily per kind: built(kind) -> Path."""
    from mopd.retriever.builder import IndexSpec, build_index

    root = tmp_path_factory.mktemp("indexes")
    cache = {}

    def get(kind: str) -> Path:
        if kind not in cache:
            cache[kind] = build_index(small_corpus, root / kind, IndexSpec(encoder="minilm", index_kind=kind))
        return cache[kind]

    return get
