"""H-MAS: Leader -> waves of parallel Searchers -> Answerer, as a step-synchronous state machine.

Phases: the Leader acts (one step); a wave of Searchers acts in parallel until every one has
reported (one or more steps); the Leader reads the wave's reports and acts again; a select (or
the forced fallback) hands the chosen reports and the question to the Answerer.

Step budget: every step counts, the Answerer's included, and a run uses at most ``max_steps``:
- Searchers are forced to report at step max_steps-2, so the Leader always gets a step to select;
- the Leader is forced to select when it has already dispatched ``max_rounds`` waves ('round') or
  when a new wave could no longer report in time, i.e. at step >= max_steps-2 ('step');
- the Answerer acts at the latest at step max_steps.

A wave's Searchers are lanes (:mod:`mopd.rollout.lanes`), each on its own steps: the lock-step
scheduler runs them in rounds through ``begin_step``/``searches``/``end_step``; the asynchronous one
takes them with :meth:`HMASRun.lanes`, runs each on its own, and hands back with
:meth:`HMASRun.join_lanes`. The records are the same.
"""

from __future__ import annotations

from typing import List, Optional

from mopd.rollout.agents import AnswerRequest, Leader, Searcher
from mopd.rollout.lanes import Lane, merge_events
from mopd.core.workflows import workflow
from mopd.rollout.run_state import RunContext, SearchNeed, Turn, register_state_machine

MIN_STEPS = workflow("hmas").min_steps


@register_state_machine("hmas")
class HMASRun:
    def __init__(self, ctx: RunContext):
        if ctx.settings.max_steps < MIN_STEPS:
            raise ValueError(f"hmas needs max_steps >= {MIN_STEPS} (a Leader step and the Answerer's)")
        self.ctx = ctx
        self.leader = Leader(ctx, ctx.record.question)
        self.phase = "leader"
        self.wave: list[Lane] = []
        self._wave_events = 0
        """Index of the wave's first event in the record."""
        self.answer: Optional[AnswerRequest] = None
        self.done = False

    def _leader_force(self) -> Optional[str]:
        s = self.ctx.settings
        if self.leader.rounds >= s.max_rounds:
            return "round"
        if self.ctx.step >= s.max_steps - 2:
            return "step"
        return None

    def _to_answer(self) -> None:
        self.phase = "answer"
        self.answer = AnswerRequest(self.ctx, self.ctx.record.question, self.leader.selected_reports())

    def begin_step(self) -> List[Turn]:
        ctx = self.ctx
        ctx.step += 1
        if self.phase == "wave":
            turns = []
            for lane in self.wave:  # in lock-step every lane left is at this step
                if not lane.done:
                    turn = lane.begin()
                    if turn is not None:
                        turns.append(turn)
            if turns:
                return turns
            self._wave_finished()  # every Searcher left had to end (input limit)
        if self.phase == "leader":
            request = self.leader.turn(self._leader_force())
            if request is not None:
                return [Turn(request, self.leader.receive)]
            self._to_answer()
        return [Turn(self.answer.turn(), self.answer.receive)]

    def searches(self) -> List[SearchNeed]:
        if self.phase != "wave":
            return []
        return [need for need in (lane.search() for lane in self.wave) if need is not None]

    def _wave_finished(self) -> None:
        merge_events(self.ctx, self._wave_events, self.wave)
        self.leader.add_reports([(lane.searcher.subtask, lane.searcher.report) for lane in self.wave])
        self.wave = []
        self.phase = "leader"

    def lanes(self) -> list[Lane]:
        """The wave's Searchers while a wave is out (empty otherwise), for a driver that advances
        each on its own instead of calling ``begin_step``; then :meth:`join_lanes`."""
        return list(self.wave) if self.phase == "wave" else []

    def join_lanes(self) -> None:
        """Every lane has ended (or the run stops): the wave's events go in round order, and the
        Leader acts next at the step rounds give it: the step after the wave's last turn, or the
        step at which the last Searcher had to end without a turn."""
        self.ctx.step = max(lane.step for lane in self.wave) - 1  # begin_step adds one
        self._wave_finished()

    def end_step(self) -> None:
        if self.phase == "answer":
            if self.answer.done:
                self.done = True
                self.ctx.finish()
        elif self.phase == "leader":
            if self.leader.selection is not None:
                self._to_answer()
            elif self.leader.subtasks:
                w, ctx = self.leader.rounds - 1, self.ctx
                self._wave_events = len(ctx.record.events)
                self.wave = [Lane(ctx, Searcher(ctx, f"s{w}.{i}", ctx.record.question, subtask), i,
                                  step=ctx.step + 1, force_at=ctx.settings.max_steps - 2)
                             for i, subtask in enumerate(self.leader.subtasks)]
                self.leader.subtasks = []
                self.phase = "wave"
        elif self.phase == "wave":
            for lane in self.wave:
                lane.end_turn()
            if all(lane.done for lane in self.wave):
                self._wave_finished()
