"""A step is dealt when it is done: a run stopped by a retriever outage, SIGINT
or SIGTERM at any point of a step, with any trainer.checkpoint_every, resumes to exactly the run
that was never stopped (weights, optimizer state, metrics.jsonl lines), and a signal during a
checkpoint write ends in one line with the previous checkpoint intact.

The policy is scripted so that every workflow searches (a random tiny model never writes a valid
<search>): the Searcher searches once and reports, the Answerer's candidates are drawn with
torch's global RNG, so a run that saved the RNG of an unfinished step would diverge too. The
retriever is a real HTTP client (``retriever.kind=http retriever.retries=1``) of a small server
that can be told to answer 500 after N requests."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from mopd.config import resolve
from mopd.core.errors import Interrupted
from mopd.core.roles import role_of_prompt
from mopd.rollout.scripted_engine import ScriptedEngine
from mopd.train import checkpoint as ckpt
from mopd.train.trainer import PolicyTrainer, TrainingError
from tests.helpers.training import tiny_overrides

pytestmark = pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden:UserWarning")

STEPS = 2
VOLATILE = ("time", "perf/", "rollout/wall_s", "rollout/busy_fraction", "rollout/mean_batch_rows",
            "rollout/retrieval_wait_s", "rollout/retrieval_busy_s", "rollout/tokens_per_s/")
"""metrics.jsonl keys that measure wall time (they differ between any two runs)."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fail_after = None
    served = 0

    def fail(self, after):
        """From now on, answer 500 to every request after the next ``after`` (None: never)."""
        self.served, self.fail_after = 0, after

    def url_of(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    """Search-R1's /retrieve: three passages per query, named after it; 500 past ``fail_after``."""

    def log_message(self, *args):
        pass

    def _answer(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._answer(200, {"status": "ok"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        srv = self.server
        if srv.fail_after is not None and srv.served >= srv.fail_after:
            self._answer(500, {"error": "index unavailable (test)"})
            return
        srv.served += 1
        self._answer(200, {"result": [[{"document": {"id": f"{q}#{i}", "contents": f"T{i}\npassage {i} about {q}"},
                                        "score": 1.0 - i / 10} for i in range(body["topk"])]
                                      for q in body["queries"]]})


@pytest.fixture(scope="module")
def served():
    srv = _Server(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def server(served):
    served.fail(None)
    return served


def always_searches(prompt, params):
    """The Searcher searches on its first turn and reports on the next; the Answerer's candidates
    are right or wrong by a draw of torch's global RNG (band i was formed in town i % 3)."""
    i = int(re.findall(r"band (\d+) formed", prompt)[0])
    if role_of_prompt(prompt) == "searcher":
        return f"<search>band {i}</search>" if prompt.count("<|im_start|>assistant") == 1 else "<report>a town</report>"
    picks = torch.randint(0, 2, (params.n,)).tolist()
    return [f"<answer>town {i % 3}</answer>" if p else "<answer>nowhere</answer>" for p in picks]


def trainer(model_dir, qa_file, out, url, resume=False, **extra):
    settings = {"trainer.steps": STEPS, "trainer.questions_per_step": 1, "trainer.checkpoint_every": 2,
                "trainer.keep_checkpoints": 10, "trainer.val_every": 2, "trainer.val_attempts": 1,
                "data.dev": qa_file, "data.dev_size": 1, "rollout.max_steps": 4, "rollout.max_output_tokens": 40,
                "retriever.kind": "http", "retriever.url": url, "retriever.retries": 1, **extra}
    t = PolicyTrainer(resolve("cmas_rl", tiny_overrides(model_dir, qa_file, out, **settings)), resume=resume,
                      progress=False)
    t.engine = ScriptedEngine(t.tokenizer, always_searches, record_batches=False)
    t.retriever.backoff_s = 0.01
    return t


def finished(t) -> dict:
    """What a run ends with: weights, optimizer state, metrics lines without wall times."""
    rows = [{k: v for k, v in json.loads(x).items() if not k.startswith(VOLATILE)}
            for x in (t.run_dir / "metrics.jsonl").read_text().splitlines()]
    opt = t.optimizer.state_dict()
    return {"weights": {k: v.detach().clone() for k, v in t.model.state_dict().items()},
            "optimizer": {i: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in s.items()}
                          for i, s in opt["state"].items()},
            "step": t.step, "metrics": rows}


def assert_same(a: dict, b: dict) -> None:
    assert a["step"] == b["step"] == STEPS
    assert [r["step"] for r in b["metrics"]] == [r["step"] for r in a["metrics"]]
    assert b["metrics"] == a["metrics"]
    for k in a["weights"]:
        assert torch.equal(a["weights"][k], b["weights"][k]), k
    assert a["optimizer"].keys() == b["optimizer"].keys()
    for i in a["optimizer"]:
        for k, v in a["optimizer"][i].items():
            w = b["optimizer"][i][k]
            assert torch.equal(v, w) if torch.is_tensor(v) else v == w, (i, k)


@pytest.fixture(scope="module")
def straight(tiny_model_dir, qa_file, tmp_path_factory, served):
    """The uninterrupted run."""
    served.fail(None)
    t = trainer(tiny_model_dir, qa_file, tmp_path_factory.mktemp("straight") / "run", served.url_of())
    try:
        t.fit()
        return finished(t)
    finally:
        t.close()


def resumed(model_dir, qa_file, out, url, **extra) -> dict:
    t = trainer(model_dir, qa_file, out, url, resume=True, **extra)
    try:
        t.fit()
        return finished(t)
    finally:
        t.close()


def stopped(t, expect=Interrupted):
    """Run ``t`` until it stops; the exception's line."""
    try:
        with pytest.raises(expect) as e:
            t.fit()
    finally:
        t.close()
    line = str(e.value)
    assert "\n" not in line and "Traceback" not in line, line
    return line


def test_a_retriever_outage_mid_step_resumes_exactly(straight, tiny_model_dir, qa_file, tmp_path, server):
    """500 after 2 requests: the first validation and step 1 searched, step 2's rollout fails; the
    checkpoint is step 1's with step 1's data position (not step 2's questions as dealt)."""
    server.fail(2)
    out = tmp_path / "run"
    line = stopped(trainer(tiny_model_dir, qa_file, out, server.url_of()), TrainingError)
    assert "retriever is unreachable" in line and "holds step 1, the last finished one" in line, line
    state = json.loads((out / "checkpoints" / "step_000001" / "trainer_state.json").read_text())
    assert state["step"] == 1 and state["sampler"] == {"epoch": 0, "pos": 1} and state["pending"] is None
    server.fail(None)
    assert_same(straight, resumed(tiny_model_dir, qa_file, out, server.url_of()))


def _signal_on(obj, name, signum, when=lambda n: n == 1, before=False):
    """Wrap ``obj.name`` so that its n-th call (``when(n)``) sends this process ``signum`` after
    the real call has run (``before``: before it runs); Python runs the handler at once, in the
    main thread."""
    real = getattr(obj, name)
    calls = {"n": 0}

    def wrapped(*a, **k):
        calls["n"] += 1
        if before and when(calls["n"]):
            os.kill(os.getpid(), signum)
        out = real(*a, **k)
        if not before and when(calls["n"]):
            os.kill(os.getpid(), signum)
        return out

    setattr(obj, name, wrapped)
    return calls


def test_sigterm_after_the_first_update_finishes_the_step_then_resumes_exactly(straight, tiny_model_dir,
                                                                               qa_file, tmp_path, server, capfd):
    """checkpoint_every=2 > 1: SIGTERM right after step 2's first optimizer update waits for the
    step to finish (one line says so), saves step 2 with its validation owed, and stops."""
    out = tmp_path / "run"
    t = trainer(tiny_model_dir, qa_file, out, server.url_of())
    per_step = t.cfg.trainer.ppo_minibatches
    _signal_on(t.optimizer, "step", signal.SIGTERM, when=lambda n: n == per_step + 1)
    line = stopped(t)
    assert "holds step 2, the last finished one, its validation still to run" in line, line
    assert "SIGTERM received: stopping once this step's update is complete" in capfd.readouterr().err
    assert json.loads((out / "checkpoints" / "step_000002" / "trainer_state.json").read_text())["pending"]
    assert_same(straight, resumed(tiny_model_dir, qa_file, out, server.url_of()))


def test_a_signal_inside_a_checkpoint_write_is_one_line_and_the_previous_checkpoint_stays(tiny_model_dir,
                                                                                         qa_file, tmp_path,
                                                                                         server, monkeypatch):
    """A second Ctrl-C while a checkpoint is written (DCP wraps its KeyboardInterrupt in a
    CheckpointException): one line naming the previous checkpoint, which still verifies; the
    partial one is gone."""
    out = tmp_path / "run"
    # Python's own SIGINT handler, whatever an earlier test in this process left installed (in a
    # full-suite run the kill below once raised nothing)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    t = trainer(tiny_model_dir, qa_file, out, server.url_of(), **{"trainer.val_every": 0})
    try:
        first = t.save()
        real = ckpt.dcp.save

        def cut(*a, **k):
            os.kill(os.getpid(), signal.SIGINT)    # Python's own handler: KeyboardInterrupt inside DCP
            return real(*a, **k)

        monkeypatch.setattr(ckpt.dcp, "save", cut)
        t.step = 1
        with pytest.raises(Interrupted) as e:
            t.save()
    finally:
        t.close()
        signal.signal(signal.SIGINT, previous)
    assert str(e.value) == "stopped while checkpoint step 1 was written; the previous checkpoint step_000000 is intact"
    assert ckpt.list_checkpoints(out) == [first] and ckpt.latest_checkpoint(out) == first
    assert not [p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("step_000001")]


# ---------------------------------------------------------------- every point of a step (slow)
def _phase(t, phase, signum):
    """Send ``signum`` at ``phase`` of step 2 (checkpoint_every=2; the checkpoint write: step 1's,
    with checkpoint_every=1)."""
    if phase in ("rollout", "validation"):   # after the rollout ran: its RNG draws were made
        # calls of rollout(): the first validation, step 1, step 2, step 2's validation
        _signal_on(t, "rollout", signum, when=lambda n: n == (3 if phase == "rollout" else 4))
    elif phase == "score":
        _signal_on(t, "score", signum, when=lambda n: n == 2)
    elif phase == "update":
        _signal_on(t.optimizer, "step", signum, when=lambda n: n == t.cfg.trainer.ppo_minibatches + 1)
    elif phase == "engine_refresh":
        _signal_on(t, "refresh_engine", signum, when=lambda n: n == 2)
    elif phase == "log_line":
        _signal_on(t.logger, "log", signum, when=lambda n: n == 3)    # lines 0, 1, then step 2's
    elif phase == "checkpoint_write":   # inside DCP's save, before it writes anything
        _signal_on(ckpt.dcp, "save", signum, before=True)
    else:
        raise AssertionError(phase)


PHASES = ["rollout", "score", "update", "engine_refresh", "validation", "log_line", "checkpoint_write"]


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("phase", PHASES)
def test_a_signal_at_any_point_of_a_step_resumes_exactly(phase, signum, straight, tiny_model_dir, qa_file,
                                                         tmp_path, server, monkeypatch):
    extra = {"trainer.checkpoint_every": 1} if phase == "checkpoint_write" else {}
    out = tmp_path / "run"
    t = trainer(tiny_model_dir, qa_file, out, server.url_of(), **extra)
    if phase == "checkpoint_write":
        monkeypatch.setattr(ckpt.dcp, "save", ckpt.dcp.save)   # put back after the test
    _phase(t, phase, signum)
    line = stopped(t)
    assert "the last finished one" in line and "resume with --resume" in line, line
    assert ckpt.latest_checkpoint(out) is not None
    monkeypatch.undo()
    assert_same(straight, resumed(tiny_model_dir, qa_file, out, server.url_of(), **extra))


@pytest.mark.slow
def test_a_retriever_outage_in_a_validation_saves_the_step_and_resumes_exactly(straight, tiny_model_dir,
                                                                               qa_file, tmp_path, server):
    """500 after 3 requests: step 2 is finished when its validation fails; it is saved with the
    validation owed, which the resume runs first."""
    server.fail(3)
    out = tmp_path / "run"
    line = stopped(trainer(tiny_model_dir, qa_file, out, server.url_of()), TrainingError)
    assert "holds step 2, the last finished one, its validation still to run" in line, line
    server.fail(None)
    assert_same(straight, resumed(tiny_model_dir, qa_file, out, server.url_of()))


@pytest.mark.slow
def test_a_second_ctrl_c_during_the_updates_keeps_the_previous_checkpoint(straight, tiny_model_dir, qa_file,
                                                                         tmp_path, server):
    """Ctrl-C after step 2's first update waits; a second one stops at once: step 2's half-updated
    weights are not saved, the checkpoint of step 1 (checkpoint_every=1) is kept, and a resume
    from it is exact."""
    out = tmp_path / "run"
    t = trainer(tiny_model_dir, qa_file, out, server.url_of(), **{"trainer.checkpoint_every": 1})
    k = t.cfg.trainer.ppo_minibatches
    _signal_on(t.optimizer, "step", signal.SIGINT, when=lambda n: n in (k + 1, k + 2))
    line = stopped(t)
    assert line.startswith("step 2 had applied an update, which is not saved; the last checkpoint") and \
        line.endswith("step_000001, is kept; resume with --resume"), line
    assert ckpt.latest_checkpoint(out).name == "step_000001"
    assert_same(straight, resumed(tiny_model_dir, qa_file, out, server.url_of(), **{"trainer.checkpoint_every": 1}))
