import json

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from tests.helpers.tiny_model import init_tiny_model

    out = tmp_path_factory.mktemp("tiny_model")
    return str(init_tiny_model(out, vocab_size=400, hidden=32, layers=1, heads=2, ffn=64, seed=0))


@pytest.fixture(scope="session")
def qa_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("qa") / "train.jsonl"
    rows = [{"id": f"q{i}", "question": f"Where was band {i} formed?", "golden_answers": [f"town {i % 3}"]}
            for i in range(8)]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(p)
