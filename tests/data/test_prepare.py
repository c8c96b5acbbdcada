"""`mopd data prepare`: the paper's splits from FlashRAG's folder layout and Search-R1's parquet."""

import hashlib
import json
import random

import pytest

from mopd.cli import main
from mopd.data.splits import PAPER_TEST_COUNTS, question_hash

# rows per (dataset, split) of the FlashRAG-layout fixture: NQ, TriviaQA have test splits; HotpotQA,
# 2Wiki, MuSiQue only dev (as FlashRAG ships them); PopQA and Bamboogle only test.
LAYOUT = {
    ("nq", "train"): 1301, ("nq", "dev"): 207, ("nq", "test"): 905,
    ("hotpotqa", "train"): 1103, ("hotpotqa", "dev"): 911,
    ("triviaqa", "train"): 403, ("triviaqa", "dev"): 97, ("triviaqa", "test"): 853,
    ("popqa", "test"): 831,
    ("2wikimultihopqa", "train"): 211, ("2wikimultihopqa", "dev"): 823,
    ("musique", "train"): 199, ("musique", "dev"): 819,
    ("bamboogle", "test"): 125,
}


def _question(rng):
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9)))
             for _ in range(rng.randint(4, 9))]
    return " ".join(words).capitalize() + "?"


def make_flashrag(root, seed=0, layout=LAYOUT):
    """Random questions in ROOT/<dataset>/<split>.jsonl; returns what a test needs to check.

    Some test-pool rows repeat a training question with other case and punctuation (overlap to
    remove), some repeat a question inside a file (duplicates), and some carry a gold alias "A"
    (empty after normalisation) beside a real one."""
    rng = random.Random(seed)
    rows = {}
    for (ds, split), n in layout.items():
        rows[(ds, split)] = [{"id": f"{split}_{i}", "question": _question(rng),
                              "golden_answers": [f"ans {ds} {split} {i}"], "metadata": {"k": i}} for i in range(n)]
    info = {"overlap": {"nq": 2, "triviaqa": 10, "popqa": 2}, "aliases": 0, "dup": 0}   # the paper's three
    sources = iter(rng.sample(rows[("nq", "train")] + rows[("hotpotqa", "train")], 14))
    for ds, k in info["overlap"].items():
        for r in rng.sample(rows[(ds, "test")], k):
            r["question"] = next(sources)["question"].upper().replace("?", " ?!")
    # an unused training file overlapping the test pool must change nothing
    rows[("triviaqa", "train")][0]["question"] = rows[("popqa", "test")][5]["question"]
    for key in (("nq", "train"), ("hotpotqa", "dev"), ("bamboogle", "test")):
        for r in rng.sample(rows[key], 3):
            r["golden_answers"] = ["A", r["golden_answers"][0]]
            info["aliases"] += 1
    dup = rows[("hotpotqa", "train")]
    dup.append(dict(dup[17], id="train_dup"))
    info["dup"] = 1
    for (ds, split), rs in rows.items():
        d = root / ds
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rs))
    info["rows"] = rows
    return info


def _read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _run(capsys, *argv):
    rc = main(["data", "prepare", *map(str, argv)])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err.strip()


@pytest.fixture(scope="module")
def flashrag(tmp_path_factory):
    root = tmp_path_factory.mktemp("flashrag")
    return root, make_flashrag(root)


def _ids(rows, ds, split):
    return {(ds, r["id"]) for r in rows[(ds, split)]}


def test_paper_splits_from_the_flashrag_layout(flashrag, tmp_path, capsys):
    root, info = flashrag
    out = tmp_path / "splits"
    rc, printed, err = _run(capsys, root, "--out", out)
    assert rc == 0, err
    train, dev, test = (_read(out / f"{n}.jsonl") for n in ("train", "dev", "test"))
    count = lambda rows: {d: sum(r["dataset"] == d for r in rows) for d in {r["dataset"] for r in rows}}  # noqa: E731
    assert count(test) == PAPER_TEST_COUNTS and len(test) == 5000
    assert count(dev) == {"nq": 500, "hotpotqa": 500}
    # training: NQ and HotpotQA train only, less the dev questions and the one repeated question
    assert set(count(train)) == {"nq", "hotpotqa"}
    assert len(train) == LAYOUT[("nq", "train")] + LAYOUT[("hotpotqa", "train")] - 1000
    rows = info["rows"]
    assert {(r["dataset"], r["id"]) for r in train + dev} <= _ids(rows, "nq", "train") | _ids(rows, "hotpotqa", "train")
    # test: each dataset's test split, else its dev split
    for ds in PAPER_TEST_COUNTS:
        split = "test" if (ds, "test") in LAYOUT else "dev"
        assert {(r["dataset"], r["id"]) for r in test if r["dataset"] == ds} <= _ids(rows, ds, split), ds
    m = json.loads((out / "manifest.json").read_text())
    assert {d: v["split"] for d, v in m["test_split_used"].items()} == {
        "nq": "test", "triviaqa": "test", "popqa": "test", "bamboogle": "test",
        "hotpotqa": "dev", "2wikimultihopqa": "dev", "musique": "dev"}
    assert m["test_split_used"]["hotpotqa"]["file"] == str(root / "hotpotqa" / "dev.jsonl")
    assert {d: v["count"] for d, v in m["removed_test_overlap"].items()} == info["overlap"]
    assert m["duplicates_dropped"] == info["dup"] and m["seed"] == 20260728 and m["command"] == "mopd data prepare"
    # the "A" aliases of the used files are dropped and counted, their rows kept with the real answer
    assert m["aliases_dropped"] == info["aliases"]
    assert all("A" not in r["golden_answers"] for r in train + dev + test)
    bamboogle = {r["id"]: r["golden_answers"] for r in test if r["dataset"] == "bamboogle"}
    assert len(bamboogle) == 125 and all(len(a) == 1 and a[0].startswith("ans bamboogle") for a in bamboogle.values())
    # hashes: no question shared by two splits; every output's sha256 in the manifest
    hashes = [{question_hash(r["question"]) for r in s} for s in (train, dev, test)]
    assert not (hashes[0] & hashes[1] or hashes[0] & hashes[2] or hashes[1] & hashes[2])
    for name, digest in m["outputs"].items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest
    assert sorted(m["inputs"]) == sorted(str(root / p) for p in (
        "nq/train.jsonl", "hotpotqa/train.jsonl", "nq/test.jsonl", "triviaqa/test.jsonl", "popqa/test.jsonl",
        "hotpotqa/dev.jsonl", "2wikimultihopqa/dev.jsonl", "musique/dev.jsonl", "bamboogle/test.jsonl"))
    assert "not used: " in printed and "triviaqa/train.jsonl" in printed and "(dev split: no test split)" in printed


def test_same_seed_same_files_other_seed_other_sample(flashrag, tmp_path, capsys):
    root, _ = flashrag
    outs = [tmp_path / name for name in ("a", "b", "c")]
    for out, seed in zip(outs, (3, 3, 4)):
        assert _run(capsys, root, "--out", out, "--seed", seed, "--test-counts", "nq=31,popqa=17,musique=9",
                    "--dev-counts", "hotpotqa=13")[0] == 0
    a, b, c = ((o / "test.jsonl").read_bytes() for o in outs)
    assert a == b and a != c
    assert (outs[0] / "train.jsonl").read_bytes() == (outs[1] / "train.jsonl").read_bytes()
    assert len(_read(outs[0] / "dev.jsonl")) == 13 and len(_read(outs[2] / "test.jsonl")) == 57


def test_dry_run_prints_which_file_gives_what_and_writes_nothing(flashrag, tmp_path, capsys):
    root, info = flashrag
    out = tmp_path / "never"
    rc, printed, err = _run(capsys, root, "--out", out, "--dry-run")
    assert rc == 0, err
    assert not out.exists() and "dry run: nothing written" in printed
    lines = {tuple(line.split()[:4]): line for line in printed.splitlines() if line.startswith(("train ", "test "))}
    nq_train = lines[("train", "nq", "train", "nq/train.jsonl")].split()
    assert nq_train[4:7] == [f"{LAYOUT[('nq', 'train')]:,}", f"{LAYOUT[('nq', 'train')] - 500:,}", "500"]
    hp = lines[("test", "hotpotqa", "dev", "hotpotqa/dev.jsonl")]
    assert hp.split()[4:6] == [f"{LAYOUT[('hotpotqa', 'dev')]:,}", "813"] and "no test split" in hp
    tq = lines[("test", "triviaqa", "test", "triviaqa/test.jsonl")]
    assert f"({info['overlap']['triviaqa']} removed: question in training data)" in tq
    assert len(lines) == 2 + 7
    assert _run(capsys, root, "--dry-run")[0] == 0              # no --out needed to look


def test_refuses_an_out_it_did_not_create_and_reuses_its_own(flashrag, tmp_path, capsys):
    root, _ = flashrag
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    rc, _, err = _run(capsys, root, "--out", out, "--test-counts", "nq=5", "--dev-counts", "nq=3")
    assert rc == 2 and "did not write" in err and "\n" not in err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    own = tmp_path / "own"
    for n in (5, 6):
        rc, _, err = _run(capsys, root, "--out", own, "--test-counts", f"nq={n}", "--dev-counts", "nq=3")
        assert rc == 0, err
    assert len(_read(own / "test.jsonl")) == 6
    (tmp_path / "file").write_text("x")
    rc, _, err = _run(capsys, root, "--out", tmp_path / "file", "--test-counts", "nq=5")
    assert rc == 2 and "is a file" in err
    assert _run(capsys, root)[2].endswith("--out DIR is required (or --dry-run to only print what would be written)")


def test_out_inside_root_is_not_read_back_as_a_dataset(tmp_path, capsys):
    root = tmp_path / "data"
    make_flashrag(root, seed=1)
    args = (root, "--out", root / "splits", "--test-counts", "bamboogle=20,musique=30", "--dev-counts", "nq=4")
    assert _run(capsys, *args)[0] == 0
    first = (root / "splits" / "test.jsonl").read_bytes()
    rc, printed, err = _run(capsys, *args)
    assert rc == 0, err
    assert "splits/" not in printed.split("manifest:")[0] and (root / "splits" / "test.jsonl").read_bytes() == first


def test_missing_datasets_and_malformed_rows_are_one_line(tmp_path, capsys):
    root = tmp_path / "data"
    make_flashrag(root, seed=2)
    (root / "bamboogle" / "test.jsonl").unlink()
    rc, _, err = _run(capsys, root, "--dry-run")
    assert rc == 2 and "bamboogle" in err and "no test or dev split" in err and "\n" not in err
    rc, _, err = _run(capsys, root, "--dry-run", "--train-datasets", "nq,popqa", "--test-counts", "nq=3")
    assert rc == 2 and "no train split for training dataset 'popqa'" in err
    with open(root / "nq" / "train.jsonl", "a") as f:
        f.write('{"id": "bad", "question": "", "golden_answers": ["x"]}\nnot json\n')
    args = ("--test-counts", "nq=11,popqa=7", "--dev-counts", "nq=5")
    rc, _, err = _run(capsys, root, "--out", tmp_path / "o1", *args)
    assert rc == 2 and f"{root / 'nq' / 'train.jsonl'}:{LAYOUT[('nq', 'train')] + 1}" in err
    assert not (tmp_path / "o1").exists()
    rc, printed, err = _run(capsys, root, "--out", tmp_path / "o2", "--skip-malformed", *args)
    assert rc == 0, err
    m = json.loads((tmp_path / "o2" / "manifest.json").read_text())
    assert m["malformed_rows_skipped"] == 2 and "malformed rows skipped 2" in printed
    assert len(_read(tmp_path / "o2" / "train.jsonl")) == LAYOUT[("nq", "train")] + LAYOUT[("hotpotqa", "train")] - 5


def _searchr1_row(ds, i, rng, answers=None):
    q = _question(rng)
    return {"id": f"{ds}_{i}", "data_source": ds,
            "prompt": [{"role": "user", "content": f"Answer the question with search. Question: {q}\n"}],
            "reward_model": {"ground_truth": {"target": answers or [f"gold {ds} {i}"]}, "style": "rule"},
            "extra_info": {"index": i, "split": "x"}}


def test_searchr1_parquet_layout(tmp_path, capsys):
    """Search-R1's merged files: train.parquet holds NQ and HotpotQA, test.parquet all seven datasets."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(5)
    root = tmp_path / "nq_hotpotqa_train"
    root.mkdir()
    train = [_searchr1_row(ds, i, rng) for ds, n in (("nq", 61), ("hotpotqa", 47)) for i in range(n)]
    train[3]["reward_model"]["ground_truth"]["target"] = ["the", "Real"]      # "the" normalises to ""
    sizes = {"nq": 23, "triviaqa": 19, "popqa": 13, "hotpotqa": 29, "2wikimultihopqa": 11, "musique": 17,
             "bamboogle": 9}
    test = [_searchr1_row(ds, i, rng) for ds, n in sizes.items() for i in range(n)]
    rng.shuffle(test)
    test[0]["prompt"][0]["content"] = "Question: " + train[10]["prompt"][0]["content"].split("Question: ")[1].upper()
    overlap_ds = test[0]["data_source"]
    pq.write_table(pa.Table.from_pylist(train), root / "train.parquet")
    pq.write_table(pa.Table.from_pylist(test), root / "test.parquet")
    # every eligible question of the dataset that lost one to overlap, fewer of nq and hotpotqa
    counts = {d: n - (d == overlap_ds) - {"nq": 3, "hotpotqa": 1}.get(d, 0) for d, n in sizes.items()}
    spec = ",".join(f"{k}={v}" for k, v in counts.items())
    out = tmp_path / "out"
    rc, printed, err = _run(capsys, root, "--out", out, "--test-counts", spec, "--dev-counts", "nq=6,hotpotqa=4")
    assert rc == 0, err
    tr, dv, te = (_read(out / f"{n}.jsonl") for n in ("train", "dev", "test"))
    assert len(tr) == 61 + 47 - 10 and len(dv) == 10
    got = {d: sum(r["dataset"] == d for r in te) for d in counts}
    assert got == counts
    m = json.loads((out / "manifest.json").read_text())
    assert m["removed_test_overlap"] == {overlap_ds: {"count": 1, "entries": m["removed_test_overlap"][overlap_ds]["entries"]}}
    assert m["aliases_dropped"] == 1 and m["format"] == ["parquet"]
    assert {v["file"] for v in m["test_split_used"].values()} == {str(root / "test.parquet")}
    row3 = [r for r in tr + dv if r["id"] == "nq_" + train[3]["id"]]     # ids are data_source_id
    assert row3 and row3[0]["golden_answers"] == ["Real"]
    # a FlashRAG folder beside the parquet files: the user says which to read
    (root / "nq").mkdir()
    (root / "nq" / "train.jsonl").write_text(json.dumps({"id": 1, "question": "Q?", "golden_answers": ["x"]}) + "\n")
    rc, _, err = _run(capsys, root, "--dry-run", "--test-counts", spec)
    assert rc == 2 and "--format flashrag or --format searchr1" in err
    assert _run(capsys, root, "--dry-run", "--test-counts", spec, "--dev-counts", "nq=6", "--format", "searchr1")[0] == 0


def test_the_readme_gpu_steps_for_data_parse_and_run_on_the_fixture_layout(tmp_path, capsys):
    """The GPU guide's data step is `mopd data prepare data/ ...` on FlashRAG's layout: run as written,
    with data/ being the fixture (and no `data.skip_malformed` config key named for the CLI flag)."""
    from tests.helpers.readme import GPU_GUIDE, gpu_section_commands

    steps = gpu_section_commands("data")
    assert [s[:2] for s in steps] == [["data", "prepare"], ["data", "prepare"]] and "--dry-run" in steps[0]
    make_flashrag(tmp_path / "data")
    for argv in steps:
        argv = argv[:2] + [str(tmp_path / a) if a.rstrip("/") in ("data", "splits") else a for a in argv[2:]]
        assert main(argv) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "splits" / "manifest.json").read_text())["counts"]["test"] == PAPER_TEST_COUNTS
    assert "data.skip_malformed=true skips" not in GPU_GUIDE.read_text()
