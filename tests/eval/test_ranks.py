"""Data-parallel evaluation (mopd/eval/ranks.py): shares, merge, kills and continuation.

Ranks are threads of this process here (a barrier stands for the gloo group), with a fake rollout
whose answers follow the per-request seed, as an engine's samples do; the two-process torchrun run
of `mopd eval run` itself is at the end (slow)."""

import json
import os
import subprocess
import sys
import threading

import pytest

from mopd.config import Config
from mopd.core.qa import QAExample, write_questions
from mopd.core.records import read_records, write_records
from mopd.eval.alignment import EvalError
from mopd.eval.ranks import OneRank, fold_parts, part_dir, part_dirs, run_ranked_evaluation
from mopd.eval.runner import EvalPlan, Rollout, run_evaluation
from mopd.rollout.run_state import WorkflowSettings
from mopd.rollout.sampling import derive_seed
from tests.helpers.eval_records import make_record


class Meeting:
    """A barrier whose abort fails the waits not yet released (threading.Barrier's also fails a
    released waiter that has not woken up yet)."""

    def __init__(self, parties):
        self.parties, self.count, self.generation, self.broken = parties, 0, 0, False
        self.cond = threading.Condition()

    def wait(self):
        with self.cond:
            if self.broken:
                raise threading.BrokenBarrierError
            generation, self.count = self.generation, self.count + 1
            if self.count == self.parties:
                self.count, self.generation = 0, self.generation + 1
                self.cond.notify_all()
                return
            while generation == self.generation and not self.broken:
                if not self.cond.wait(60):
                    raise TimeoutError("a rank never came to the meeting")
            if generation == self.generation:
                raise threading.BrokenBarrierError

    def abort(self):
        with self.cond:
            self.broken = True
            self.cond.notify_all()


class ThreadRanks:
    """One rank of ``world`` threads: meetings on a shared barrier, rank 0's object in a shared box."""

    def __init__(self, rank, world, shared):
        self.rank, self.world, self._shared = rank, world, shared

    @classmethod
    def group(cls, world):
        shared = {"barrier": Meeting(world), "box": None}
        return [cls(r, world, shared) for r in range(world)]

    def broadcast(self, obj):
        if self.rank == 0:
            self._shared["box"] = obj
        self.barrier()
        got = self._shared["box"]
        self.barrier()
        return got

    def barrier(self):
        self._shared["barrier"].wait()

    def abort(self):
        self._shared["barrier"].abort()


class SeededRollout:
    """run_workflows-compatible: each workflow's answer is drawn from its own seed (seed, question,
    attempt), so a record is the same whichever rank, chunk or launch runs it. ``fail_on`` ids: a
    kill (KeyboardInterrupt) when a chunk holds one of them."""

    def __init__(self, fail_on=()):
        self.ids, self.fail_on, self.lock = [], set(fail_on), threading.Lock()

    def __call__(self, engine, retriever, tokenizer, questions, settings, *, attempts, method="", progress=True):
        with self.lock:
            self.ids += [q.id for q in questions]
        if self.fail_on & {q.id for q in questions}:
            raise KeyboardInterrupt
        return [make_record(q.id, q.dataset, a, f"<answer>{derive_seed(settings.seed, q.id, a) % 97}</answer>")
                for q in questions for a in range(attempts)]


def _questions(n):
    return [QAExample(id=f"q{i}", dataset="nq" if i % 3 else "hq", question=f"Q{i}?", answers=["Paris"])
            for i in range(n)]


def _plan(out, attempts=3, chunk=2):
    return EvalPlan(out, WorkflowSettings.for_evaluation(Config(), "cmas"), attempts=attempts, method="m",
                    chunk_questions=chunk)


def _on_ranks(world, out, questions, rollout, plan=None):
    """Every rank's run in its own thread; returns each rank's exception (None when it returned)."""
    plan = plan or _plan(out)
    errors = [None] * world

    def one(ranks):
        try:
            run_ranked_evaluation(ranks, Rollout(None, None, None, rollout), questions, plan)
        except EvalError as e:       # rank 0's outcome, which every rank ends with
            errors[ranks.rank] = e
        except BaseException as e:   # a killed rank: the others' meetings fail, as torchrun stops them
            errors[ranks.rank] = e
            ranks.abort()

    threads = [threading.Thread(target=one, args=(r,)) for r in ThreadRanks.group(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def _by_key(path):
    """Each workflow's record (its wall time left out), by question and attempt."""
    out = {}
    for r in read_records(path):
        d = r.to_dict()
        d.pop("duration_s")
        out[(r.dataset, r.question_id, r.attempt)] = d
    return out


def test_two_ranks_equal_one_process_record_for_record(tmp_path):
    qs = _questions(7)
    one = run_evaluation(None, None, None, qs, _plan(tmp_path / "one"), run_fn=SeededRollout())
    rollout = SeededRollout()
    assert _on_ranks(2, tmp_path / "two", qs, rollout) == [None, None]
    two = tmp_path / "two" / "records.jsonl"
    lines = [json.loads(x) for x in two.read_text().splitlines()]
    assert len(lines) == 21 == len(_by_key(two))                 # each workflow once
    assert _by_key(two) == _by_key(one)                          # the same records
    assert [(d["question_id"], d["attempt"]) for d in lines] == [(q.id, a) for q in qs for a in range(3)]
    assert sorted(rollout.ids) == sorted(q.id for q in qs)       # every question run once, by one rank
    run = json.loads((tmp_path / "two" / "run.json").read_text())
    assert run["ranks"] == 2 and run["finished_questions"] == run["questions"] == 7
    assert run["settings"] == json.loads((tmp_path / "one" / "run.json").read_text())["settings"]
    assert not (tmp_path / "two" / "ranks").exists()             # the parts are folded and gone


def test_shares_are_balanced_and_disjoint(tmp_path):
    rollout = SeededRollout()
    seen = {}

    class Recording(SeededRollout):
        def __call__(self, *a, **kw):
            seen.setdefault(threading.current_thread().name, []).extend(q.id for q in a[3])
            return rollout(*a, **kw)

    assert _on_ranks(3, tmp_path, _questions(10), Recording()) == [None] * 3
    sizes = sorted(len(v) for v in seen.values())
    assert sizes == [3, 3, 4] and sorted(i for v in seen.values() for i in v) == sorted(f"q{i}" for i in range(10))


def test_a_killed_launch_continues_where_it_stopped_on_any_number_of_ranks(tmp_path):
    qs = _questions(9)
    one = run_evaluation(None, None, None, qs, _plan(tmp_path / "one"), run_fn=SeededRollout())
    out = tmp_path / "run"
    # Two ranks: rank 0 runs q0 q2 | q4 q6 | q8, rank 1 q1 q3 | q5 q7, and is killed in its second chunk.
    errors = _on_ranks(2, out, qs, SeededRollout(fail_on={"q7"}))
    assert isinstance(errors[1], KeyboardInterrupt) and isinstance(errors[0], threading.BrokenBarrierError)
    assert not (out / "records.jsonl").exists()                  # nothing merged ...
    saved = {r.question_id for p in part_dirs(out) for r in read_records(p / "records.jsonl")}
    assert saved == {"q0", "q2", "q4", "q6", "q8", "q1", "q3"}     # ... but each finished chunk is in its part
    # Continued on three ranks: only what no part holds is run again, then merged once.
    again = SeededRollout()
    assert _on_ranks(3, out, qs, again) == [None] * 3
    assert set(again.ids) == {q.id for q in qs} - saved
    assert _by_key(out / "records.jsonl") == _by_key(one)
    assert len((out / "records.jsonl").read_text().splitlines()) == 27
    assert json.loads((out / "run.json").read_text())["ranks"] == 3
    # A third start runs nothing.
    third = SeededRollout()
    assert _on_ranks(2, out, qs, third) == [None, None] and third.ids == []
    assert _by_key(out / "records.jsonl") == _by_key(one)


def test_a_one_process_run_takes_over_a_killed_multi_rank_one(tmp_path):
    qs = _questions(6)
    out = tmp_path / "run"
    _on_ranks(2, out, qs, SeededRollout(fail_on={"q4", "q5"}))
    saved = {r.question_id for p in part_dirs(out) for r in read_records(p / "records.jsonl")}
    assert saved == {"q0", "q2", "q1", "q3"}
    rollout = SeededRollout()
    run_ranked_evaluation(OneRank(), Rollout(None, None, None, rollout), qs, _plan(out))
    assert rollout.ids == ["q4", "q5"] and not (out / "ranks").exists()
    assert len(_by_key(out / "records.jsonl")) == 18
    assert json.loads((out / "run.json").read_text())["ranks"] == 1


def test_a_kill_between_the_merge_and_the_parts_removal_keeps_each_workflow_once(tmp_path):
    qs = _questions(4)
    plan = _plan(tmp_path)
    part = part_dir(tmp_path, 1, 2)
    run_evaluation(None, None, None, qs[:3], EvalPlan(part, plan.settings, attempts=3, method="m"),
                   run_fn=SeededRollout())
    recs = read_records(part / "records.jsonl")
    write_records(tmp_path / "records.jsonl", recs[:6])            # merged, then killed before the removal
    (part / "records.jsonl").write_text((part / "records.jsonl").read_text()[:-30])   # and a torn last line
    assert fold_parts(tmp_path, qs, plan) == 0
    keys = [(r.question_id, r.attempt) for r in read_records(tmp_path / "records.jsonl")]
    assert len(keys) == len(set(keys)) == 6 and not part_dirs(tmp_path)   # q2's torn record is not kept


def test_a_part_of_other_settings_is_refused_before_anything_changes(tmp_path):
    qs = _questions(3)
    other = WorkflowSettings.for_evaluation(Config(), "hmas")
    run_evaluation(None, None, None, qs, EvalPlan(part_dir(tmp_path, 0, 2), other, attempts=3, method="m"),
                   run_fn=SeededRollout())
    with pytest.raises(EvalError, match="other settings"):
        fold_parts(tmp_path, qs, _plan(tmp_path))
    assert part_dirs(tmp_path) and not (tmp_path / "records.jsonl").exists()


def test_missing_shares_after_every_rank_finished_are_an_error_naming_the_shared_filesystem(tmp_path, monkeypatch):
    import mopd.eval.ranks as ranks_mod

    real = ranks_mod.run_evaluation

    def on_a_local_disk(engine, retriever, tokenizer, questions, plan, **kw):   # rank 1 writes elsewhere
        if plan.out_dir.name == "rank1-of-2":
            plan = EvalPlan(tmp_path / "node1" / "rank1-of-2", plan.settings, attempts=plan.attempts,
                            method=plan.method, manifest=plan.manifest)
        return real(engine, retriever, tokenizer, questions, plan, **kw)

    monkeypatch.setattr(ranks_mod, "run_evaluation", on_a_local_disk)
    errors = _on_ranks(2, tmp_path / "run", _questions(4), SeededRollout())
    assert all(isinstance(e, EvalError) and "filesystem all nodes share" in str(e) for e in errors)


# --------------------------------------------------------------------------------------------
# The command under torchrun: two gloo ranks, each with its own HF engine on a tiny model.
# --------------------------------------------------------------------------------------------

RETRIEVER_PATCH = """
import sys, mopd.retriever
from tests.helpers.retrievers import FakeRetriever
mopd.retriever.load_retriever = lambda cfg: FakeRetriever()
from mopd.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    pytest.importorskip("transformers")
    from tests.helpers.tiny_model import init_tiny_model

    return init_tiny_model(tmp_path_factory.mktemp("tiny") / "model", hidden=32, layers=1, heads=2, ffn=64,
                           max_positions=4096)


def _mopd(args, nproc, cwd, tmp_path):
    from tests.train.test_distributed import free_port

    script = tmp_path / "with_fake_retriever.py"
    script.write_text(RETRIEVER_PATCH)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(cwd), CUDA_VISIBLE_DEVICES="")
    launch = ([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr",
               "127.0.0.1", "--master_port", str(free_port())] if nproc > 1 else [sys.executable])
    p = subprocess.run([*launch, str(script), *args], capture_output=True, text=True, timeout=600, env=env, cwd=cwd)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout


@pytest.mark.slow
def test_torchrun_two_gloo_ranks_equal_one_process(tiny_model, tmp_path):
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    manifest = tmp_path / "test.jsonl"
    write_questions(manifest, [QAExample(f"q{i}", "nq" if i % 2 else "hq", f"Where was band {i} formed?", ["Paris"])
                               for i in range(5)])
    args = ["eval", "run", "--model", str(tiny_model), "--workflow", "cmas", "--manifest", str(manifest),
            "--attempts", "2", "--chunk", "1"]
    # One question a rollout call, lock-step: each call's engine batches are the same whichever rank
    # runs it (in float32 a batch's shape moves a logit in its last bits, which can flip a sampled
    # token: an engine's property, not the ranks'; tests/rollout/test_hf_continuous.py).
    settings = ["rollout.max_output_tokens=12", "rollout.max_steps=2", "retriever.index=bundled",
                "rollout.scheduler=lockstep"]
    _mopd([*args, "--out", str(tmp_path / "one"), *settings], 1, root, tmp_path)
    stdout = _mopd([*args, "--out", str(tmp_path / "two"), *settings], 2, root, tmp_path)
    assert "[rank 1 of 2]" in stdout and "records merged" in stdout
    assert _by_key(tmp_path / "two" / "records.jsonl") == _by_key(tmp_path / "one" / "records.jsonl")
    assert len(_by_key(tmp_path / "two" / "records.jsonl")) == 10
    run = json.loads((tmp_path / "two" / "run.json").read_text())
    assert run["ranks"] == 2 and run["finished_questions"] == 5
    assert not (tmp_path / "two" / "ranks").exists()
