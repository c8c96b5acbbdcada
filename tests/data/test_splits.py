import json
from pathlib import Path

import pytest

from mopd.core.qa import DataError, load_questions
from mopd.data.splits import (
    Splits,
    build_splits,
    check_disjoint,
    normalize_question,
    parse_counts,
    question_hash,
)

FIX = Path(__file__).parent.parent / "fixtures" / "qa"


def pools():
    train, test = [], []
    for ds in ("nq", "hotpotqa"):
        train += load_questions(FIX / ds / "train.jsonl")[0]
        test += load_questions(FIX / ds / "test.jsonl")[0]
    return train, test


def test_normalize_question():
    assert normalize_question("Who  WROTE \u201cHamlet\u201d?!") == "who wrote hamlet"
    assert normalize_question("\uff37ho") == "who"          # NFKC folds full-width letters
    assert question_hash("Who wrote  book 3?") == question_hash("who wrote book 3")


def test_dataset_name_from_folder():
    train, _ = pools()
    assert {ex.dataset for ex in train} == {"nq", "hotpotqa"}


def test_overlap_removed_and_reported_and_disjoint():
    train, test = pools()
    s = build_splits(train, test, test_counts={"nq": 20, "hotpotqa": 10}, dev_counts={"nq": 5}, seed=3)
    assert len(s.test) == 30 and len(s.dev) == 5 and len(s.train) == 40 + 30 - 5
    assert {r["id"] for r in s.removed["nq"]} == {"nq-200", "nq-201"}
    assert [r["id"] for r in s.removed["hotpotqa"]] == ["hotpotqa-200"]
    assert s.duplicates_dropped == 1
    hashes = [{question_hash(e.question) for e in getattr(s, k)} for k in ("train", "dev", "test")]
    assert not (hashes[0] & hashes[1]) and not (hashes[0] & hashes[2]) and not (hashes[1] & hashes[2])


def test_deterministic_for_seed_and_different_for_another():
    train, test = pools()
    a = build_splits(train, test, test_counts={"nq": 10, "hotpotqa": 10}, seed=1)
    b = build_splits(train, test, test_counts={"nq": 10, "hotpotqa": 10}, seed=1)
    c = build_splits(train, test, test_counts={"nq": 10, "hotpotqa": 10}, seed=2)
    ids = lambda s: [e.id for e in s.test]  # noqa: E731
    assert ids(a) == ids(b)
    assert ids(a) != ids(c)


def test_requesting_too_many_is_an_error():
    train, test = pools()
    with pytest.raises(DataError, match="hotpotqa.*25 eligible"):
        build_splits(train, test, test_counts={"hotpotqa": 26})
    with pytest.raises(DataError, match="popqa"):
        build_splits(train, test, test_counts={"popqa": 1})


def test_check_disjoint_catches_shared_hash():
    train, _ = pools()
    with pytest.raises(DataError, match="train and test share 1"):
        check_disjoint(Splits(train=train[:3], dev=[], test=[train[1]]))


def test_parse_counts():
    assert parse_counts("paper")["bamboogle"] == 125 and sum(parse_counts("paper").values()) == 5000
    assert parse_counts("nq=3, hotpotqa=4") == {"nq": 3, "hotpotqa": 4}
    assert parse_counts("all") is None
    with pytest.raises(DataError):
        parse_counts("nq:3")


def test_malformed_rows(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"id": 1, "question": "ok?", "golden_answers": ["b"]}\n'   # not "a": an article scores as ""
                 '{"id": 2, "question": "", "golden_answers": ["b"]}\n'
                 'nonsense\n'
                 '{"id": 4, "question": "q?", "golden_answers": "single"}\n')
    with pytest.raises(DataError, match=r"d.jsonl:2: field 'question'"):
        load_questions(p)
    exs, rep = load_questions(p, skip_malformed=True)
    assert [e.id for e in exs] == ["1", "4"] and exs[1].answers == ["single"]
    assert rep.skipped == 2 and "d.jsonl:3" in rep.problems[1]


def test_searchr1_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {"data_source": "nq", "prompt": [{"role": "user", "content": "Answer it. Question: who is x?\n"}],
         "reward_model": {"ground_truth": {"target": ["X", "Ex"]}, "style": "rule"},
         "extra_info": {"index": 7}},
        {"data_source": "hotpotqa", "prompt": [{"role": "user", "content": "where is y?"}],
         "reward_model": {"ground_truth": {"target": ["Y"]}, "style": "rule"}, "extra_info": {"index": 8}},
    ]
    p = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), p)
    exs, _ = load_questions(p)
    assert [(e.id, e.dataset, e.question, e.answers) for e in exs] == [
        ("nq_7", "nq", "who is x?", ["X", "Ex"]), ("hotpotqa_8", "hotpotqa", "where is y?", ["Y"])]
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{"data_source": "nq", "prompt": [{"role": "user", "content": "q"}]}]), bad)
    with pytest.raises(DataError, match=r"bad.parquet: row 0: missing field 'reward_model"):
        load_questions(bad)


def test_cli_build_splits_writes_manifest(tmp_path, capsys):
    from mopd.cli import main

    out = tmp_path / "splits"
    rc = main(["data", "build-splits", "--train", str(FIX / "nq" / "train.jsonl"), str(FIX / "hotpotqa" / "train.jsonl"),
               "--test", str(FIX / "nq" / "test.jsonl"), str(FIX / "hotpotqa" / "test.jsonl"),
               "--test-counts", "nq=12,hotpotqa=8", "--dev-counts", "hotpotqa=4", "--seed", "5", "--out", str(out)])
    assert rc == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["counts"]["test"] == {"hotpotqa": 8, "nq": 12} and m["counts"]["dev"] == {"hotpotqa": 4}
    assert m["removed_test_overlap"]["nq"]["count"] == 2
    assert len(m["inputs"]) == 4 and set(m["outputs"]) == {"train.jsonl", "dev.jsonl", "test.jsonl"}
    test_rows = [json.loads(line) for line in (out / "test.jsonl").read_text().splitlines()]
    assert len(test_rows) == 20 and "golden_answers" in test_rows[0]
    rc = main(["data", "build-splits", "--train", str(tmp_path / "nope.jsonl"), "--test",
               str(FIX / "nq" / "test.jsonl"), "--out", str(out)])
    assert rc == 2 and "does not exist" in capsys.readouterr().err


def test_cli_build_splits_drops_empty_aliases_and_counts_them(tmp_path, capsys):
    from mopd.cli import main

    rows = [{"id": f"q{i}", "question": f"question number {i}?", "golden_answers": ["A", f"x{i}"] if i % 3 else [f"x{i}"]}
            for i in range(10)]
    for split in ("train", "test"):
        (tmp_path / "nq").mkdir(exist_ok=True)
        (tmp_path / "nq" / f"{split}.jsonl").write_text(
            "".join(json.dumps(dict(r, question=f"{split} {r['question']}")) + "\n" for r in rows))
    out = tmp_path / "out"
    assert main(["data", "build-splits", "--train", str(tmp_path / "nq" / "train.jsonl"), "--test",
                 str(tmp_path / "nq" / "test.jsonl"), "--out", str(out)]) == 0
    assert "dropped 6 gold answer(s)" in capsys.readouterr().out
    m = json.loads((out / "manifest.json").read_text())
    assert m["aliases_dropped"] == 12 and m["counts"]["train"] == {"nq": 10}
    assert all(len(json.loads(line)["golden_answers"]) == 1 for line in (out / "test.jsonl").read_text().splitlines())
