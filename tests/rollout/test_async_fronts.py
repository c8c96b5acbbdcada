"""Engine and retrieval fronts: what goes into each batch, where results go, errors, closing;
the vLLM step front against a fake step-driven engine; the rollout statistics."""

import threading
import time
from concurrent.futures import wait
from types import SimpleNamespace

import pytest

from mopd.core.generation import Completion, GenerationRequest, SamplingParams
from mopd.core.records import AgentCall, WorkflowRecord
from mopd.rollout.async_engine import GATHER_FIRST_S, GATHER_SHARE, BatchingFront, FrontClosed, engine_front
from mopd.rollout.async_retrieval import RetrievalFront
from mopd.rollout.rollout_stats import BusyMeter, RolloutStats
from mopd.rollout.engine import EngineCapabilities
from mopd.rollout.vllm_async_engine import VLLMStepFront


def req(tag: int, n: int = 1):
    return GenerationRequest(prompt_ids=[tag], params=SamplingParams(n=n, max_new_tokens=tag % 7 + 1))


class GatedEngine:
    """generate() echoes each prompt n times; the first call waits until released."""

    def __init__(self):
        self.batches = []
        self.entered = threading.Event()
        self.release = threading.Event()

    def generate(self, requests):
        self.batches.append([r.prompt_ids[0] for r in requests])
        self.entered.set()
        self.release.wait(10)
        if any(r.prompt_ids[0] < 0 for r in requests):
            raise ValueError("negative prompt")
        return [[Completion([r.prompt_ids[0], j], [0.0, 0.0], "stop", f"{r.prompt_ids[0]}.{j}")
                 for j in range(r.params.n)] for r in requests]


def test_batching_front_takes_everything_pending_up_to_the_cap():
    engine = GatedEngine()
    front = BatchingFront(engine, max_batch_calls=5)
    try:
        first = front.submit(req(1))
        assert engine.entered.wait(5)
        # While the first batch runs, 2+3 rows fit under the cap, the 4-row request starts the
        # next batch, and a 9-row request (over the cap) goes alone.
        later = [front.submit(req(t, n)) for t, n in ((2, 2), (3, 3), (4, 4), (5, 9), (6, 1))]
        engine.release.set()
        wait([first, *later], timeout=10)
        assert engine.batches == [[1], [2, 3], [4], [5], [6]]
        for fut, (t, n) in zip([first, *later], ((1, 1), (2, 2), (3, 3), (4, 4), (5, 9), (6, 1))):
            assert [c.text for c in fut.result()] == [f"{t}.{j}" for j in range(n)]
        assert front.meter.units == 5 and front.meter.rows == 1 + 5 + 4 + 9 + 1
    finally:
        front.close()


def test_batching_front_errors_reach_only_their_batch_and_close_fails_the_rest():
    engine = GatedEngine()
    front = BatchingFront(engine)
    bad = front.submit(req(-1))
    assert engine.entered.wait(5)
    good = front.submit(req(2))
    engine.release.set()
    with pytest.raises(ValueError, match="negative"):
        bad.result(10)
    assert good.result(10)[0].text == "2.0"
    front.close()
    with pytest.raises(FrontClosed):
        front.submit(req(3))
    assert not any(t.is_alive() for t in front._threads)


def test_batching_front_waits_for_runs_about_to_submit_but_not_forever():
    engine = GatedEngine()
    engine.release.set()
    away = [1]  # runs neither done nor waiting on the engine
    front = BatchingFront(engine, others=lambda: away[0], gather_s=5.0)
    try:
        a = front.submit(req(1))
        time.sleep(0.05)
        assert not engine.batches  # one run is still on its way: gather
        b = front.submit(req(2))
        away[0] = 0
        wait([a, b], timeout=10)
        assert engine.batches == [[1, 2]]
        front.gather_s = 0.05  # a run that never comes (a hung search): the batch goes at the deadline
        away[0] = 1
        assert front.submit(req(3)).result(10)[0].text == "3.0"
        assert engine.batches[-1] == [3]
    finally:
        front.close()
    adaptive = BatchingFront(engine)  # default: a quarter of the mean call so far
    try:
        assert adaptive._gather_s() == GATHER_FIRST_S
        adaptive.meter.work(3.0, 8)
        adaptive.meter.work(1.0, 2)
        assert adaptive._gather_s() == pytest.approx(GATHER_SHARE * 2.0)
    finally:
        adaptive.close()


class FakeStepEngine:
    """A vLLM-like LLMEngine: each request decodes one token per step() until it has
    max_tokens; outputs of finished requests come back from the step that finished them."""

    def __init__(self):
        self.running = {}
        self.steps = []
        self.aborted = []

    def add(self, request_id, prompt_ids, params):
        self.running[request_id] = (prompt_ids, params, [])

    def step(self):
        time.sleep(0.002)  # a decode step takes time: the long request outlives the test's checks
        self.steps.append(sorted(self.running))
        out = []
        for rid, (prompt, params, toks) in list(self.running.items()):
            toks.append(prompt[0] * 10 + len(toks))
            if len(toks) >= params.max_tokens:
                del self.running[rid]
                samples = [SimpleNamespace(token_ids=list(toks), logprobs=[{t: -0.5} for t in toks],
                                           finish_reason="length") for _ in range(params.n)]
                out.append(SimpleNamespace(request_id=rid, finished=True, outputs=samples))
        return out

    def has_unfinished_requests(self):
        return bool(self.running)

    def abort_request(self, ids, internal=False):
        self.aborted.extend(ids)
        for i in ids:
            self.running.pop(i, None)


class FakeLLM:
    def __init__(self):
        self.llm_engine = FakeStepEngine()
        self.counter = 0

    def enqueue(self, prompts, params, use_tqdm=False):
        ids = []
        for p, sp in zip(prompts, params):
            self.counter += 1
            self.llm_engine.add(str(self.counter), p["prompt_token_ids"], sp)
            ids.append(str(self.counter))
        return ids


class FakeVLLMEngine:
    """VLLMEngine's surface that VLLMStepFront uses, and its declared capabilities."""

    capabilities = EngineCapabilities(step_front=True, prefers_async=True)

    def __init__(self):
        self.llm = FakeLLM()
        self.tokenizer = SimpleNamespace(decode=lambda ids, skip_special_tokens=True: " ".join(map(str, ids)))

    def _params(self, p):
        return SimpleNamespace(n=p.n, max_tokens=p.max_new_tokens)

    def step_front(self, max_rows=256):
        return VLLMStepFront(self)

    def reset_prefix_cache(self):
        pass


def test_vllm_front_joins_requests_between_steps_and_resolves_them_when_they_finish():
    engine = FakeVLLMEngine()
    front = engine_front(engine)
    assert isinstance(front, VLLMStepFront)
    try:
        long = front.submit(GenerationRequest([1], SamplingParams(max_new_tokens=300)))
        short = front.submit(GenerationRequest([2], SamplingParams(n=2, max_new_tokens=2)))
        got_short = short.result(10)
        assert [c.token_ids for c in got_short] == [[20, 21], [20, 21]]
        assert got_short[0].logprobs == [-0.5, -0.5]
        assert not long.done()  # the short one did not wait for the long one
        late = front.submit(GenerationRequest([3], SamplingParams(max_new_tokens=3)))
        assert late.result(10)[0].text == "30 31 32"
        assert long.result(10)[0].token_ids == [10 + i for i in range(300)]
        steps = engine.llm.llm_engine.steps
        assert any(s == ["1", "3"] for s in steps)  # the late request ran beside the long one
        assert front.meter.units == len(steps) and front.meter.mean_rows > 1
    finally:
        front.close()


def test_vllm_front_close_aborts_unfinished_requests():
    engine = FakeVLLMEngine()
    entered, gate = threading.Event(), threading.Event()
    step = engine.llm.llm_engine.step
    engine.llm.llm_engine.step = lambda: (entered.set(), gate.wait(10), step())[2]
    front = VLLMStepFront(engine)
    fut = front.submit(GenerationRequest([4], SamplingParams(max_new_tokens=50)))
    assert entered.wait(10)  # the request is in the engine, mid-step
    closer = threading.Thread(target=front.close)
    closer.start()
    gate.set()
    closer.join(10)
    assert not closer.is_alive()
    with pytest.raises(FrontClosed):
        fut.result(1)
    assert engine.llm.llm_engine.aborted == ["1"] and not engine.llm.llm_engine.running


class GatedRetriever:
    def __init__(self):
        self.batches = []
        self.entered = threading.Event()
        self.release = threading.Event()

    def search(self, queries, k):
        self.batches.append(list(queries))
        self.entered.set()
        self.release.wait(10)
        if "short" in queries and len(queries) > 1:
            return [[f"{q}#{i}" for i in range(k)] for q in queries][:-1]  # one result too few
        return [[f"{q}#{i}" for i in range(k)] for q in queries]


def test_retrieval_front_micro_batches_and_retries_a_bad_batch_query_by_query():
    retriever = GatedRetriever()
    front = RetrievalFront(retriever, 2, max_batch_queries=3)
    try:
        first = front.submit("a")
        assert retriever.entered.wait(5)
        rest = [front.submit(q) for q in ("b", "c", "d", "e", "short", "f")]
        retriever.release.set()
        assert [f.result(10) for f in [first, *rest]] == [[f"{q}#0", f"{q}#1"] for q in "abcde"] + [
            ["short#0", "short#1"], ["f#0", "f#1"]]
        # a | b c d (cap 3) | e short f (one result short) -> e | short | f alone
        assert retriever.batches == [["a"], ["b", "c", "d"], ["e", "short", "f"], ["e"], ["short"], ["f"]]
        assert front.meter.rows == 7 and front.meter.waits == 7
    finally:
        front.close()


def test_busy_meter_and_rollout_stats():
    meter = BusyMeter()
    meter.work(2.0, 40)
    meter.work(1.0, 10)
    meter.wait(0.5)
    meter.wait(1.5)
    assert meter.mean_rows == pytest.approx((80 + 10) / 3) and meter.mean_wait_s == 1.0
    rec = WorkflowRecord(question_id="q", dataset="d", question="?", answers=["a"], attempt=0)
    rec.calls = [AgentCall("s0", "searcher", output_tokens=30),
                 AgentCall("a0.0", "answerer", output_tokens=6), AgentCall("s1", "searcher", output_tokens=4)]
    stats = RolloutStats.collect(4.0, meter, BusyMeter(), [rec, rec], failed_runs=1)
    assert stats.tokens == {"leader": 0, "searcher": 68, "answerer": 12}
    assert stats.busy_fraction == pytest.approx(0.75)
    m = stats.as_metrics()
    assert m["rollout/tokens_per_s/searcher"] == 17.0 and m["rollout/tokens_per_s/all"] == 20.0
    assert m["rollout/failed_runs"] == 1.0 and m["rollout/mean_batch_rows"] == pytest.approx(30.0)
