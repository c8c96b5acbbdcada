"""C-MAS: the Searcher -> Answerer cascade as a step-synchronous state machine.

Step budget: every step, including the Answerer's, counts, and a run never uses more than
``max_steps`` steps. The Searcher acts in steps 1 .. max_steps-1 (searching, or re-asked after an
invalid output) and is forced to report in step max_steps-1; the Answerer then produces its
``n`` candidates from the question and the report (empty when the Searcher never reported).
"""

from __future__ import annotations

from typing import List

from mopd.rollout.agents import AnswerRequest, Searcher
from mopd.core.workflows import workflow
from mopd.rollout.run_state import RunContext, SearchNeed, Turn, register_state_machine

MIN_STEPS = workflow("cmas").min_steps


@register_state_machine("cmas")
class CMASRun:
    def __init__(self, ctx: RunContext):
        if ctx.settings.max_steps < MIN_STEPS:
            raise ValueError(f"cmas needs max_steps >= {MIN_STEPS} (one Searcher step and the Answerer's)")
        self.ctx = ctx
        q = ctx.record.question
        self.searcher = Searcher(ctx, "s0", q)
        self.answer = None
        self.done = False

    def begin_step(self) -> List[Turn]:
        ctx = self.ctx
        ctx.step += 1
        if self.answer is None:
            request = self.searcher.turn(force=ctx.step >= ctx.settings.max_steps - 1)
            if request is not None:
                return [Turn(request, self.searcher.receive)]
            self.answer = AnswerRequest(ctx, ctx.record.question, [self.searcher.report])
        return [Turn(self.answer.turn(), self.answer.receive)]

    def searches(self) -> List[SearchNeed]:
        if self.searcher.pending_query is None or self.answer is not None:
            return []
        return [SearchNeed(self.searcher.pending_query, self.searcher.deliver)]

    def end_step(self) -> None:
        if self.answer is not None and self.answer.done:
            self.done = True
            self.ctx.finish()
        elif self.searcher.done and self.answer is None:
            self.answer = AnswerRequest(self.ctx, self.ctx.record.question, [self.searcher.report])
