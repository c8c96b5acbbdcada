"""Discrete-event simulation of one rollout step: lock-step rounds against asynchronous turn-level
scheduling, on an engine cost model calibrated on published vLLM numbers.

Workload (``RunTrace``): what each workflow run does, step by step: the turns of each step (new
prompt tokens to prefill, context length, output tokens of each sample) and the searches after it.
Traces come from real runs of our workflows (:func:`trace_runs` drives the real state machines),
here the tiny world's scripted team at the paper's limits; the simulation resamples them and
scales token counts (outputs to the paper's 512-token cap).

Engine (``CostModel``): one engine step decodes one token for every sequence in flight and
prefills newly admitted ones (chunked prefill in the same step):

    step_s = weights_s + kv_s_per_token * (context tokens in flight) + row_s * rows
             + prefill_s_per_token * (new prompt tokens)

At most ``max_seqs`` sequences are in flight; more wait. Retrieval (``Retrieval``): a batch of Q
queries takes ``base_s + per_query_s * Q``; ``workers`` batches may run at once; a free worker
takes every query pending.

Schedulers, as implemented in ``mopd.rollout``:
- lock-step (:mod:`mopd.rollout.scheduler`): each round, every active run's turns go to the engine
  (``max_batch_calls`` rows per generate call, one call after the other); the round ends when the
  last sequence finishes; then all searches go as one batch; then the next round;
- async (:mod:`mopd.rollout.async_scheduler`): a run submits its turns the moment its previous step
  (turns and searches) is done; sequences join the running batch at the next engine step; searches
  are micro-batched by free retrieval workers while the engine keeps decoding. With ``lanes`` (the
  implementation since per-Searcher lanes, :mod:`mopd.rollout.lanes`) the Searchers of an H-MAS
  wave each go on their own: a Searcher's next turn is submitted when its own turn and search are
  done, and the Leader's step starts when the whole wave has ended; without, a wave moves one
  step at a time (its slowest Searcher's turn and search hold the others).

Traces note each turn's agent (call id) and the searches it asked for, so a wave's Searchers can be
told apart; :func:`widen` makes waves of several subtasks out of one-subtask traces.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import random
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Deque, Dict, List, Optional, Sequence, Tuple


@dataclass
class TurnTrace:
    prefill: int
    """Prompt tokens to compute: not cached from the call's previous turn, nor (first turn) shared
    with an earlier prompt of the same role (the system prompt; vLLM's prefix cache holds it)."""
    context: int
    """Prompt tokens in all (what each decode step attends to, before the generated ones)."""
    outputs: List[int]
    """Generated tokens of each sample (n > 1: the Answerer's candidates)."""
    agent: str = ""
    """The call's id ('l0', 's0.1', 'a0'; empty in traces recorded without it)."""
    searches: int = 0
    """Searches this turn asked for (run after it)."""


@dataclass
class StepTrace:
    turns: List[TurnTrace]
    searches: int


@dataclass
class RunTrace:
    steps: List[StepTrace] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d) -> "RunTrace":
        return cls([StepTrace([TurnTrace(**t) for t in s["turns"]], s["searches"]) for s in d["steps"]])


def trace_runs(engine, retriever, tokenizer, questions, settings, attempts: int = 1) -> List[RunTrace]:
    """Drive the real workflow state machines (in lock-step rounds, one engine batch per round) and
    note each run's turns and searches step by step (records do not depend on the scheduler; only
    their shape is kept)."""
    from mopd.rollout.scheduler import new_runs

    runs = new_runs(questions, attempts, tokenizer, settings, "trace")
    traces = [RunTrace() for _ in runs]
    first: Dict[str, List[int]] = {}  # agent kind -> a first prompt seen before (shared system prompt)
    seen: Dict[int, int] = {}  # agent -> tokens of its call so far (cached prefix)
    agents = []  # keeps every agent alive, so that id() stays unique
    active = list(range(len(runs)))
    while active:
        turns = {i: runs[i].begin_step() for i in active}
        owners: Dict[int, list] = {i: [] for i in active}
        flat = [t for i in active for t in turns[i]]
        outs = []
        for s in range(0, len(flat), settings.max_batch_calls):
            outs += engine.generate([t.request for t in flat[s:s + settings.max_batch_calls]])
        outs_of = iter(outs)
        for i in active:
            step = StepTrace([], 0)
            for t in turns[i]:
                completions = next(outs_of)
                owner = getattr(t.deliver, "__self__", t)
                owners[i].append(owner)
                agents.append(owner)
                agent, ids = id(owner), t.request.prompt_ids
                cached = seen.get(agent)
                if cached is None:  # a first turn: the engine's prefix cache holds the role's system prompt
                    cached = _common_prefix(first.setdefault(type(owner).__name__, ids), ids)
                step.turns.append(TurnTrace(prefill=len(ids) - min(cached, len(ids) - 1), context=len(ids),
                                            outputs=[len(c.token_ids) for c in completions],
                                            agent=_agent_name(owner)))
                seen[agent] = len(ids) + len(completions[0].token_ids)
                t.deliver(completions)
            traces[i].steps.append(step)
        needs = {i: runs[i].searches() for i in active}
        flat_needs = [n for i in active for n in needs[i]]
        if flat_needs:
            found = retriever.search([n.query for n in flat_needs], settings.topk)
            for need, passages in zip(flat_needs, found):
                need.deliver(passages)
        for i in active:
            traces[i].steps[-1].searches = len(needs[i])
            for need in needs[i]:  # the turn of the agent that asked for it
                who = getattr(need.deliver, "__self__", None)
                for turn, owner in zip(traces[i].steps[-1].turns, owners[i]):
                    turn.searches += owner is who
            runs[i].end_step()
        active = [i for i in active if not runs[i].done]
    return traces


def _agent_name(owner) -> str:
    """The call id of a turn's owner: a wave lane's Searcher, a Leader or Searcher, an Answerer request."""
    agent = getattr(owner, "searcher", owner)
    call = getattr(agent, "call", None)
    return call.call_id if call is not None else getattr(agent, "prefix", "")


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def save_traces(path, traces: Sequence[RunTrace], meta: dict) -> None:
    Path(path).write_text(json.dumps({"meta": meta, "runs": [asdict(t) for t in traces]}) + "\n")


def load_traces(path) -> Tuple[List[RunTrace], dict]:
    d = json.loads(Path(path).read_text())
    return [RunTrace.from_dict(r) for r in d["runs"]], d["meta"]


def scaled(trace: RunTrace, output_scale: float, prompt_scale: float, cap: int) -> RunTrace:
    """Token counts scaled (outputs capped at ``cap``), at least one token each."""
    s = lambda n, f: max(1, round(n * f))  # noqa: E731
    def turn(t: TurnTrace) -> TurnTrace:
        return dataclasses.replace(t, prefill=s(t.prefill, prompt_scale), context=s(t.context, prompt_scale),
                                   outputs=[min(cap, s(o, output_scale)) for o in t.outputs])

    return RunTrace([StepTrace([turn(t) for t in st.turns], st.searches) for st in trace.steps])


@dataclass(frozen=True)
class CostModel:
    """Seconds per engine step (see the module docstring); defaults: Qwen3-4B bf16 on one H200 (see
    bench/RESULTS.md for the calibration)."""

    weights_s: float = 2.18e-3
    kv_s_per_token: float = 3.99e-8
    row_s: float = 5e-6
    prefill_s_per_token: float = 1.63e-5
    max_seqs: int = 256

    def step(self, rows: int, context: int, prefill: int) -> float:
        return (self.weights_s + self.kv_s_per_token * context + self.row_s * rows
                + self.prefill_s_per_token * prefill)


@dataclass(frozen=True)
class Retrieval:
    base_s: float = 0.020
    per_query_s: float = 1e-4
    workers: int = 2

    def latency(self, queries: int) -> float:
        return self.base_s + self.per_query_s * queries


@dataclass
class SimResult:
    wall_s: float
    busy_s: float
    tokens: int
    engine_steps: int
    mean_rows: float

    @property
    def busy_fraction(self) -> float:
        return self.busy_s / self.wall_s

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


class _Seq:
    __slots__ = ("run", "left", "context", "prefill")

    def __init__(self, run: int, out: int, context: int, prefill: int):
        self.run, self.left, self.context, self.prefill = run, out, context, prefill


class _Engine:
    """Continuous batching: sequences wait in FIFO order, join at the next step, leave when done."""

    def __init__(self, cost: CostModel):
        self.cost = cost
        self.waiting: Deque[_Seq] = deque()
        self.running: List[_Seq] = []
        self.busy = self.row_seconds = 0.0
        self.steps = 0

    def idle(self) -> bool:
        return not self.waiting and not self.running

    def step(self) -> Tuple[float, List[_Seq]]:
        prefill = 0
        while self.waiting and len(self.running) < self.cost.max_seqs:
            s = self.waiting.popleft()
            prefill += s.prefill
            self.running.append(s)
        rows = len(self.running)
        dt = self.cost.step(rows, sum(s.context for s in self.running), prefill)
        self.busy += dt
        self.row_seconds += rows * dt
        self.steps += 1
        done = []
        for s in self.running:
            s.left -= 1
            s.context += 1
        done = [s for s in self.running if s.left <= 0]
        self.running = [s for s in self.running if s.left > 0]
        return dt, done


def _seqs(owner, turns: Sequence[TurnTrace]) -> list[_Seq]:
    out = []
    for t in turns:
        for j, o in enumerate(t.outputs):  # samples of one request share the prefill
            out.append(_Seq(owner, o, t.context, t.prefill if j == 0 else 0))
    return out


def simulate_lockstep(runs: Sequence[RunTrace], cost: CostModel, retrieval: Retrieval,
                      max_batch_calls: int = 256) -> SimResult:
    t, tokens = 0.0, 0
    engine = _Engine(cost)
    rounds = max(len(r.steps) for r in runs)
    for k in range(rounds):
        seqs = [s for i, r in enumerate(runs) if k < len(r.steps) for s in _seqs(i, r.steps[k].turns)]
        tokens += sum(s.left for s in seqs)
        for start in range(0, len(seqs), max_batch_calls):  # one generate() per chunk, in turn
            engine.waiting.extend(seqs[start:start + max_batch_calls])
            while not engine.idle():
                dt, _ = engine.step()
                t += dt
        queries = sum(r.steps[k].searches for r in runs if k < len(r.steps))
        if queries:
            t += retrieval.latency(queries)
    return SimResult(t, engine.busy, tokens, engine.steps, engine.row_seconds / engine.busy)


Action = tuple[Sequence[TurnTrace], int]
"""Turns submitted together, and the searches run once they are all done."""


def plan(trace: RunTrace, lanes: bool) -> list[list[list[Action]]]:
    """A run as the async scheduler drives it: segments one after the other; each segment a list of
    lanes that go side by side; each lane a list of actions. A step is a segment of one lane of one
    action; with ``lanes``, the consecutive steps of a wave (every turn a Searcher's) are one segment
    with a lane per Searcher, each turn its own action."""
    segments: list[dict[str, list[Action]]] = []
    wave: dict[str, list[Action]] | None = None
    for step in trace.steps:
        if lanes and all(t.agent.startswith("s") for t in step.turns):
            if wave is None:
                wave = {}
                segments.append(wave)
            for t in step.turns:
                wave.setdefault(t.agent, []).append(([t], t.searches))
        else:
            wave = None
            segments.append({"": [(step.turns, step.searches)]})
    return [list(seg.values()) for seg in segments]


def simulate_async(runs: Sequence[RunTrace], cost: CostModel, retrieval: Retrieval, lanes: bool = False
                   ) -> SimResult:
    t, tokens = 0.0, 0
    engine = _Engine(cost)
    plans = [plan(r, lanes) for r in runs]
    segment_of = [0] * len(runs)
    lanes_left = [0] * len(runs)
    action_of: dict[tuple[int, int], int] = {}  # (run, lane) -> its current action
    open_seqs: dict[tuple[int, int], int] = {}
    search_queue: list[tuple[int, int]] = []  # lanes whose searches wait for a worker
    in_flight: list[tuple[float, int, list[tuple[int, int]]]] = []  # (end, tie, lanes): retrieval batches
    tie = 0

    def action(key: tuple[int, int]) -> Action:
        i, j = key
        return plans[i][segment_of[i]][j][action_of[key]]

    def start_segment(i: int) -> None:
        if segment_of[i] >= len(plans[i]):
            return
        lanes_left[i] = len(plans[i][segment_of[i]])
        for j in range(lanes_left[i]):
            action_of[(i, j)] = 0
            start_action((i, j))

    def start_action(key: tuple[int, int]) -> None:
        nonlocal tokens
        seqs = _seqs(key, action(key)[0])
        open_seqs[key] = len(seqs)
        tokens += sum(s.left for s in seqs)
        engine.waiting.extend(seqs)

    def next_action(key: tuple[int, int]) -> None:
        i, j = key
        action_of[key] += 1
        if action_of[key] < len(plans[i][segment_of[i]][j]):
            start_action(key)
            return
        lanes_left[i] -= 1
        if lanes_left[i] == 0:
            segment_of[i] += 1
            start_segment(i)

    def after_turns(key: tuple[int, int]) -> None:
        if action(key)[1]:
            search_queue.append(key)
        else:
            next_action(key)

    def dispatch() -> None:
        nonlocal tie
        while search_queue and len(in_flight) < retrieval.workers:
            batch = list(search_queue)
            search_queue.clear()
            q = sum(action(key)[1] for key in batch)
            tie += 1
            heapq.heappush(in_flight, (t + retrieval.latency(q), tie, batch))

    for i in range(len(runs)):
        start_segment(i)
    while not engine.idle() or in_flight or search_queue:
        dispatch()
        if engine.idle():
            t = max(t, in_flight[0][0])  # nothing to decode: wait for the next search batch
        else:
            dt, done = engine.step()
            t += dt
            for s in done:
                open_seqs[s.run] -= 1
                if open_seqs[s.run] == 0:
                    after_turns(s.run)
        while in_flight and in_flight[0][0] <= t:
            _, _, batch = heapq.heappop(in_flight)
            for key in batch:
                next_action(key)
    return SimResult(t, engine.busy, tokens, engine.steps, engine.row_seconds / engine.busy)


def widen(trace: RunTrace, subtasks: int, pool: Sequence[list[TurnTrace]], rng: random.Random,
          max_steps: int) -> RunTrace:
    """``trace`` with ``subtasks`` Searchers in every wave: its own and ``subtasks``-1 Searcher calls
    drawn from ``pool`` (each its turns, as recorded), all starting with the wave. A wave lasts as
    long as its longest Searcher; as in the workflow, a Searcher still going at step max_steps-2
    reports there (its later turns are dropped, that turn searches nothing) and a Leader at step
    max_steps-2 or later selects (its later waves and turns are dropped). The Leader's and the
    Answerer's turns are kept as recorded (their prompts do not grow with the extra reports)."""
    segments = plan(trace, lanes=True)
    out = RunTrace()
    answer = segments[-1][0][0][0]
    for seg in segments[:-1]:
        step = len(out.steps) + 1
        if len(seg) == 1 and len(seg[0]) == 1 and not seg[0][0][0][0].agent.startswith("s"):  # Leader
            out.steps.append(StepTrace(list(seg[0][0][0]), seg[0][0][1]))
            if step >= max_steps - 2:
                break
            continue
        lanes = [[t for turns, _ in lane for t in turns] for lane in seg]
        lanes += [rng.choice(pool) for _ in range(subtasks - len(lanes))]
        room = max_steps - 2 - step + 1
        for k in range(max(min(len(lane), room) for lane in lanes)):
            turns = []
            for j, lane in enumerate(lanes):
                if k < min(len(lane), room):
                    forced = k == room - 1 and len(lane) > room
                    turns.append(dataclasses.replace(lane[k], agent=f"s{step}.{j}",
                                                     searches=0 if forced else lane[k].searches))
            out.steps.append(StepTrace(turns, sum(t.searches for t in turns)))
    out.steps.append(StepTrace(list(answer), 0))
    return out


def searcher_calls(traces: Sequence[RunTrace]) -> list[list[TurnTrace]]:
    """Every Searcher call of ``traces``: its turns, in order."""
    calls = []
    for trace in traces:
        for seg in plan(trace, lanes=True):
            if seg[0][0][0][0].agent.startswith("s"):
                calls += [[t for turns, _ in lane for t in turns] for lane in seg]
    return calls


def sample_runs(traces: Sequence[RunTrace], n: int, seed: int, output_scale: float, prompt_scale: float,
                cap: int) -> List[RunTrace]:
    rng = random.Random(seed)
    return [scaled(rng.choice(traces), output_scale, prompt_scale, cap) for _ in range(n)]


def compare(runs: Sequence[RunTrace], cost: Optional[CostModel] = None, retrieval: Optional[Retrieval] = None
            ) -> Dict[str, SimResult]:
    cost, retrieval = cost or CostModel(), retrieval or Retrieval()
    return {"lockstep": simulate_lockstep(runs, cost, retrieval),
            "async": simulate_async(runs, cost, retrieval),
            "async_lanes": simulate_async(runs, cost, retrieval, lanes=True)}
