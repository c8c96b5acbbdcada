"""`mopd model init-tiny` and `mopd rollout` end to end on the tiny model and a BM25 index."""

import json

import pytest

from mopd.cli import main
from mopd.core.records import read_records


@pytest.fixture(scope="module")
def bm25_index(tmp_path_factory):
    from mopd.retriever import IndexSpec, build_index, bundled_corpus_path

    return build_index(bundled_corpus_path(), tmp_path_factory.mktemp("idx") / "bm25", IndexSpec(index_kind="bm25"))


@pytest.fixture
def question_file(tmp_path):
    p = tmp_path / "q.jsonl"
    rows = [{"id": str(i), "question": f"Where is island {i}?", "golden_answers": ["Nufath"]} for i in range(3)]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_init_tiny_writes_a_loadable_model(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("Zanzibarium is a made-up word.\n" * 5)
    assert main(["model", "init-tiny", "--out", str(tmp_path / "m"), "--corpus", str(corpus), "--hidden", "64",
                 "--heads", "2", "--seed", "3"]) == 0
    from transformers import AutoConfig, AutoTokenizer

    cfg = AutoConfig.from_pretrained(tmp_path / "m")
    tok = AutoTokenizer.from_pretrained(tmp_path / "m")
    assert cfg.model_type == "qwen3" and cfg.hidden_size == 64 and cfg.tie_word_embeddings
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert len(tok.encode("<search>", add_special_tokens=False)) == 1
    assert main(["model", "init-tiny", "--out", str(tmp_path / "bad"), "--hidden", "65"]) == 2
    assert "multiple of heads" in capsys.readouterr().err


def test_tiny_model_is_deterministic(tmp_path):
    from safetensors.torch import load_file

    from tests.helpers.tiny_model import init_tiny_model

    a = load_file(init_tiny_model(tmp_path / "a", seed=1) / "model.safetensors")
    b = load_file(init_tiny_model(tmp_path / "b", seed=1) / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    assert (tmp_path / "a" / "tokenizer.json").read_text() == (tmp_path / "b" / "tokenizer.json").read_text()


def test_rollout_command_writes_records(tiny_dir, bm25_index, question_file, tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    rc = main(["rollout", "--model", str(tiny_dir), "--workflow", "cmas", "--data", str(question_file),
               "--attempts", "2", "--out", str(out), "--device", "cpu", "--no-progress", "--limit", "2",
               f"retriever.index={bm25_index}", "rollout.max_output_tokens=8"])
    assert rc == 0, capsys.readouterr().err
    records = read_records(out)
    assert [(r.question_id, r.attempt) for r in records] == [("0", 0), ("0", 1), ("1", 0), ("1", 1)]
    assert all(r.workflow == "cmas" and r.method == "cmas_base" and len(r.candidates) == 1 for r in records)
    assert "4 cmas workflows on 2 questions" in capsys.readouterr().out


def test_rollout_command_errors_are_one_line(tiny_dir, question_file, tmp_path, capsys):
    base = ["rollout", "--data", str(question_file), "--out", str(tmp_path / "x.jsonl")]
    assert main(base + ["--model", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(base + ["--model", str(tiny_dir), "rollout.engine=vllm"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'multiagent-opd[gpu]'" in err and len(err.strip().splitlines()) == 1
    assert main(base + ["--model", str(tiny_dir), "rollout.max_stepz=3"]) == 2
    assert "max_steps" in capsys.readouterr().err
