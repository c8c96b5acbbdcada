"""Scale, said before it costs: more ranks than questions a step are refused in one
line, an uneven deal is said, and under torchrun every rank checks that it sees the run directory
rank 0 writes (several nodes need a shared filesystem)."""

import os
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest

from mopd.cli import main
from mopd.config import resolve
from mopd.train.preflight import SHARED_CHECK_FILE, PreflightError, check_ranks, check_shared_dir, deal_problem
from mopd.train.sampler import QuestionSampler


@pytest.mark.parametrize("world", [8, 16, 32])
def test_the_papers_32_questions_deal_evenly_on_8_16_and_32_ranks(world):
    assert deal_problem(32, world) == (None, None)
    shares = [len(QuestionSampler(1000, 32, 0, rank=r, world=world).next_indices()) for r in range(world)]
    assert shares == [32 // world] * world        # docs/gpu_training.md's 4, 2 and 1 questions per rank per step


def test_more_ranks_than_questions_are_refused_and_an_uneven_deal_is_said():
    refusal, _ = deal_problem(32, 33)
    assert refusal.startswith("33 ranks but trainer.questions_per_step=32") and "1 rank(s)" in refusal
    assert "trainer.questions_per_step=33 or more" in refusal and "\n" not in refusal
    # the sampler itself would give the 33rd rank nothing
    assert QuestionSampler(1000, 32, 0, rank=32, world=33).next_indices() == []
    _, note = deal_problem(32, 24)
    assert note == ("trainer.questions_per_step=32 over 24 ranks: 8 rank(s) get 2 questions a step and 16 get 1 "
                    "(the fuller ranks set the pace; a multiple of 24 evens it)")


def test_mopd_train_on_more_ranks_than_questions_stops_in_one_line_before_a_model_loads(
        tiny_model_dir, qa_file, tmp_path, capsys, monkeypatch):
    import mopd.train.trainer

    monkeypatch.setattr(mopd.train.trainer.PolicyTrainer, "__init__", lambda *a, **k: pytest.fail("a model loaded"))
    for key, value in {"WORLD_SIZE": "17", "RANK": "3", "LOCAL_RANK": "3"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    out = tmp_path / "run"
    rc = main(["train", "tiny_cmas_rl", f"model.path={tiny_model_dir}", f"data.train={qa_file}",
               f"trainer.out_dir={out}", "trainer.questions_per_step=16"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "Traceback" not in err, err
    assert err.startswith("mopd train: error: 17 ranks but trainer.questions_per_step=16") and \
        f"(on rank 3 of 17, host {__import__('socket').gethostname()})" in err
    assert not out.exists()


def test_one_process_checks_no_ranks():
    cfg = resolve("tiny_cmas_rl", ["trainer.questions_per_step=2"])
    assert check_ranks(cfg, env={}) == [] and check_ranks(cfg, env={"WORLD_SIZE": "1"}) == []
    with pytest.raises(PreflightError, match="3 ranks but"):
        check_ranks(cfg, env={"WORLD_SIZE": "3", "RANK": "0"})


@pytest.fixture
def store(monkeypatch):
    """A store server (torchrun's agent serves one); each thread rank connects its own client."""
    import torch.distributed as dist

    import mopd.train.preflight

    monkeypatch.setattr(mopd.train.preflight, "RANKS_WAIT", timedelta(seconds=30))   # a failure fails fast
    return dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30))


def _meet(dirs, store, prefix):
    """check_shared_dir on len(dirs) thread ranks, rank r seeing dirs[r]; each rank's error or None."""
    import torch.distributed as dist

    errors = [None] * len(dirs)
    clients = [dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=30))
               for _ in dirs]

    def one(rank):
        try:
            check_shared_dir("trainer.out_dir", str(dirs[rank]), rank, len(dirs), clients[rank], prefix)
        except PreflightError as e:
            errors[rank] = str(e)

    threads = [threading.Thread(target=one, args=(r,)) for r in range(len(dirs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_ranks_that_share_the_run_directory_pass_and_leave_it_as_it_was(tmp_path, store):
    fresh = tmp_path / "new" / "run"
    assert _meet([fresh] * 3, store, "a") == [None] * 3
    assert not fresh.exists() and (tmp_path / "new").is_dir()      # made for the check, removed after it
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "run.json").write_text("{}")
    assert _meet([kept] * 2, store, "b") == [None, None]
    assert sorted(p.name for p in kept.iterdir()) == ["run.json"] and not (kept / SHARED_CHECK_FILE).exists()


def test_a_rank_whose_run_directory_is_another_one_is_refused_on_it_and_on_rank_0(tmp_path, store):
    shared, local = tmp_path / "shared" / "run", tmp_path / "node1-local" / "run"
    errors = _meet([shared, shared, local], store, "c")
    assert errors[1] is None
    assert "trainer.out_dir=" in errors[2] and "on rank 2 (host " in errors[2]
    assert "must be on a filesystem all of them share" in errors[2] and "\n" not in errors[2]
    assert errors[0].startswith("1 of 2 other ranks do not see trainer.out_dir=") and errors[2] in errors[0]


WORKER = """
import json, os, sys
from mopd.config import resolve
from mopd.train.preflight import PreflightError, check_ranks

rank = os.environ["RANK"]
out = sys.argv[1] if sys.argv[2] == "shared" else f"{sys.argv[1]}-rank{rank}"
cfg = resolve("tiny_cmas_rl", [f"trainer.out_dir={out}", "trainer.questions_per_step=3"])
try:
    notes, error = check_ranks(cfg), None
except PreflightError as e:
    notes, error = [], str(e)
open(f"{sys.argv[1]}.rank{rank}.json", "w").write(json.dumps({"notes": notes, "error": error}))
"""


@pytest.mark.slow
def test_under_torchrun_every_rank_meets_on_torchruns_own_store(tmp_path):
    import json

    from tests.train.test_distributed import free_port

    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(root))
    results = {}
    for mode in ("shared", "local"):
        base = tmp_path / mode / "run"
        base.parent.mkdir()
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
               "127.0.0.1", "--master_port", str(free_port()), str(script), str(base), mode]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=root)
        assert p.returncode == 0, p.stderr[-3000:]
        results[mode] = [json.loads(Path(f"{base}.rank{r}.json").read_text()) for r in range(2)]
    assert [r["error"] for r in results["shared"]] == [None, None]
    assert results["shared"][0]["notes"][0].startswith("trainer.questions_per_step=3 over 2 ranks")
    assert "is not the directory rank 0" in results["local"][1]["error"]
    assert results["local"][0]["error"].startswith("1 of 1 other ranks do not see")
