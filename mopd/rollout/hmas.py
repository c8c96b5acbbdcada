"""H-MAS: Leader -> waves of parallel Searchers -> Answerer, as a step-synchronous state machine.

Phases: the Leader acts (one step); a wave of Searchers acts in parallel until every one has
reported (one or more steps); the Leader reads the wave's reports and acts again; a select (or
the forced fallback) hands the chosen reports and the question to the Answerer.

Step budget: every step counts, the Answerer's included, and a run uses at most ``max_steps``:
- Searchers are forced to report at step max_steps-2, so the Leader always gets a step to select;
- the Leader is forced to select when it has already dispatched ``max_rounds`` waves ('round') or
  when a new wave could no longer report in time, i.e. at step >= max_steps-2 ('step');
- the Answerer acts at the latest at step max_steps.
"""

from __future__ import annotations

from typing import List, Optional

from mopd.rollout.agents import AnswerRequest, Leader, Searcher
from mopd.rollout.run_state import RunContext, SearchNeed, Turn

MIN_STEPS = 2


class HMASRun:
    workflow = "hmas"

    def __init__(self, ctx: RunContext):
        if ctx.settings.max_steps < MIN_STEPS:
            raise ValueError(f"hmas needs max_steps >= {MIN_STEPS} (a Leader step and the Answerer's)")
        self.ctx = ctx
        self.leader = Leader(ctx, ctx.record.question)
        self.phase = "leader"
        self.wave: List[Searcher] = []
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
            force = ctx.step >= ctx.settings.max_steps - 2
            turns = []
            for s in self.wave:
                if not s.done:
                    request = s.turn(force)
                    if request is not None:
                        turns.append(Turn(request, s.receive))
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
        return [SearchNeed(s.pending_query, s.deliver) for s in self.wave if s.pending_query is not None]

    def _wave_finished(self) -> None:
        self.leader.add_reports([(s.subtask, s.report) for s in self.wave])
        self.wave = []
        self.phase = "leader"

    def end_step(self) -> None:
        if self.phase == "answer":
            if self.answer.done:
                self.done = True
                self.ctx.finish()
        elif self.phase == "leader":
            if self.leader.selection is not None:
                self._to_answer()
            elif self.leader.subtasks:
                w = self.leader.rounds - 1
                self.wave = [Searcher(self.ctx, f"s{w}.{i}", self.ctx.record.question, subtask)
                             for i, subtask in enumerate(self.leader.subtasks)]
                self.leader.subtasks = []
                self.phase = "wave"
        elif self.phase == "wave" and all(s.done for s in self.wave):
            self._wave_finished()
