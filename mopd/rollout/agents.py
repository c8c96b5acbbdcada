"""The three roles as small state machines inside one run: each owns its AgentCall(s), turns
completions into events, and says what it needs next (a turn, a search, nothing).

Forced transitions (docs/architecture.md, "Workflows and the action grammar"), shared by C-MAS and H-MAS:
- A Searcher at its last step gets the order to report in that turn's prompt (``FORCE_REPORT``)
  and a ``limit`` event ('step'). If that turn is not a valid report (a search included: it is not
  run, but its query counts as a search action), it is recorded as invalid and the Searcher ends
  with an empty report.
- A Searcher whose next prompt would exceed the input limit ends with an empty report
  (``limit`` 'input'); an invalid output is recorded and re-asked in the next step with
  ``INVALID_SEARCHER`` (the re-ask counts against the step limit).
- The Leader is handled likewise with ``FORCE_SELECT``: if its forced turn is not a valid select,
  or it cannot be prompted any more (input limit), the environment selects every report so far
  (a ``select`` event with text 'fallback').
"""

from __future__ import annotations

from typing import List, Optional

from mopd.core.actions import parse_answerer, parse_leader, parse_searcher, search_queries
from mopd.core.generation import Completion, GenerationRequest
from mopd.core.records import AgentCall
from mopd.core.scoring import extract_answer
from mopd.rollout.prompts import (
    Report,
    leader_feedback,
    render_answerer_prompt,
    render_leader_prompt,
    render_searcher_prompt,
    searcher_feedback,
)
from mopd.rollout.run_state import RunContext, to_record_passages


def _note_output_limit(ctx: RunContext, call_id: str, completion: Completion) -> None:
    if completion.finish_reason == "length":
        ctx.event("limit", call_id, "output")


class Searcher:
    def __init__(self, ctx: RunContext, call_id: str, question: str, subtask: Optional[str] = None):
        self.ctx = ctx
        self.question, self.subtask = question, subtask
        self.call = AgentCall(call_id=call_id, role="searcher", step=ctx.step,
                              parent=subtask if subtask is not None else question)
        ctx.record.calls.append(self.call)
        self.transcript = ctx.transcript(self.call)
        self.done = False
        self.report = ""
        self.pending_query: Optional[str] = None
        self._passages = None
        self._invalid = False
        self._forced = False

    def turn(self, force: bool) -> Optional[GenerationRequest]:
        """The request of this step (``force``: the last step, report now); None when the call
        had to end instead (input limit)."""
        cid = self.call.call_id
        if self.transcript.turns == 0:
            self.call.step = self.ctx.step
            show = self.ctx.settings.searcher_sees_question
            if not self.transcript.start(render_searcher_prompt(self.ctx.tokenizer, self.question, self.subtask,
                                                                force_report=force, show_question=show,
                                                                template_kwargs=self.ctx.settings.template_kwargs())):
                self.ctx.event("limit", cid, "input")
        else:
            content = searcher_feedback(self._passages, invalid=self._invalid, force_report=force)
            if not self.transcript.append_env(content):
                self.ctx.event("limit", cid, "input")
                self.done = True
                return None
        self._passages, self._invalid, self._forced = None, False, force
        if force:
            self.ctx.event("limit", cid, "step")
        return self.transcript.request(self.ctx.params("searcher", cid, self.transcript.turns))

    def receive(self, completions: List[Completion]) -> None:
        c = completions[0]
        cid = self.call.call_id
        self.transcript.add_model_turn(c)
        _note_output_limit(self.ctx, cid, c)
        action = parse_searcher(c.text)
        if action.kind == "report":
            self.report, self.done = action.text, True
            self.ctx.event("report", cid, action.text)
        elif action.kind == "search" and not self._forced:
            self.pending_query = action.text  # recorded with its passages by deliver()
        else:
            # The paper's recorder counts every non-empty query in a complete <search> tag, also in
            # an invalid output or on the forced-report turn, where the search is not run.
            for query in search_queries(c.text):
                self.ctx.event("search", cid, query)
            self.call.invalid = True
            self.ctx.event("invalid", cid, c.text)
            self._invalid = True
            if self._forced:
                self.done = True

    def deliver(self, passages) -> None:
        """Passages of this step's search, shown at the start of the next turn."""
        self.ctx.event("search", self.call.call_id, self.pending_query, passages=to_record_passages(passages))
        self.pending_query = None
        self._passages = list(passages)


class Leader:
    def __init__(self, ctx: RunContext, question: str):
        self.ctx = ctx
        self.question = question
        self.call = AgentCall(call_id="l0", role="leader", step=ctx.step, parent=question)
        ctx.record.calls.append(self.call)
        self.transcript = ctx.transcript(self.call)
        self.reports: List[Report] = []
        self.new_reports: List[Report] = []
        self.rounds = 0
        self.subtasks: List[str] = []
        """Subtasks of the wave it just dispatched (empty when it did not)."""
        self.selection: Optional[List[int]] = None
        """Set when the Leader (or the fallback) selected: 1-based report numbers."""
        self._invalid = False
        self._forced = False

    def add_reports(self, subtasks_and_reports) -> None:
        for subtask, text in subtasks_and_reports:
            r = Report(index=len(self.reports) + 1, subtask=subtask, text=text)
            self.reports.append(r)
            self.new_reports.append(r)

    def turn(self, force: Optional[str]) -> Optional[GenerationRequest]:
        """``force``: None, or the limit that forces a select ('round' or 'step')."""
        cid = self.call.call_id
        if self.transcript.turns == 0:
            self.call.step = self.ctx.step
            if not self.transcript.start(render_leader_prompt(self.ctx.tokenizer, self.question,
                                                              force_select=bool(force),
                                                              template_kwargs=self.ctx.settings.template_kwargs())):
                self.ctx.event("limit", cid, "input")
        else:
            content = leader_feedback(self.new_reports, invalid=self._invalid, force_select=bool(force))
            if not self.transcript.append_env(content):
                self.ctx.event("limit", cid, "input")
                self._fallback_select()
                return None
        self.new_reports, self._invalid, self._forced = [], False, bool(force)
        self.subtasks = []
        if force:
            self.ctx.event("limit", cid, force)
        return self.transcript.request(self.ctx.params("leader", cid, self.transcript.turns))

    def receive(self, completions: List[Completion]) -> None:
        c = completions[0]
        cid = self.call.call_id
        self.transcript.add_model_turn(c)
        _note_output_limit(self.ctx, cid, c)
        action = parse_leader(c.text, len(self.reports))
        if action.kind == "select":
            self.selection = list(action.selection)
            self.ctx.event("select", cid, selection=self.selection)
        elif action.kind == "subtasks" and not self._forced:
            cap = self.ctx.settings.max_searchers_per_wave or len(action.subtasks)
            self.subtasks = list(action.subtasks[:cap])
            for s in self.subtasks:
                self.ctx.event("subtask", cid, s)
            for s in action.subtasks[cap:]:
                self.ctx.event("dropped_subtask", cid, s)
            self.rounds += 1
        else:
            self.call.invalid = True
            self.ctx.event("invalid", cid, c.text)
            self._invalid = True
            if self._forced:
                self._fallback_select()

    def _fallback_select(self) -> None:
        self.selection = [r.index for r in self.reports]
        self.ctx.event("select", self.call.call_id, "fallback", selection=self.selection)

    def selected_reports(self) -> List[str]:
        return [self.reports[i - 1].text for i in (self.selection or [])]


class AnswerRequest:
    """One answering request: ``n`` candidates of the Answerer, one AgentCall each, sharing the
    prompt and a group id; the last candidate gives the record's final answer."""

    def __init__(self, ctx: RunContext, question: str, reports: List[str], request_index: int = 0):
        self.ctx = ctx
        r = ctx.record
        self.group = f"{r.dataset}/{r.question_id}/{r.attempt}/a{request_index}"
        self.prefix = f"a{request_index}"
        self.question, self.reports = question, reports
        self.done = False

    def turn(self) -> GenerationRequest:
        ctx, n = self.ctx, self.ctx.settings.answer_candidates
        prompt = render_answerer_prompt(ctx.tokenizer, self.question, self.reports,
                                        template_kwargs=ctx.settings.template_kwargs())
        self.transcripts = []
        for j in range(n):
            call = AgentCall(call_id=f"{self.prefix}.{j}", role="answerer", step=ctx.step, group=self.group,
                             parent=self.question)
            ctx.record.calls.append(call)
            t = ctx.transcript(call)
            fits = t.start(prompt)
            self.transcripts.append(t)
            request = t.request(ctx.params("answerer", self.prefix, 0, n=n))
        if not fits:
            ctx.event("limit", self.prefix, "input")
        return request

    def receive(self, completions: List[Completion]) -> None:
        ctx = self.ctx
        for t, c in zip(self.transcripts, completions):
            cid = t.call.call_id
            t.add_model_turn(c)
            _note_output_limit(ctx, cid, c)
            ctx.event("answer", cid, c.text)
            if not parse_answerer(c.text).valid:
                t.call.invalid = True
                ctx.event("invalid", cid, c.text)
        ctx.record.candidates = [c.text for c in completions]
        ctx.record.final_answer = extract_answer(completions[-1].text) if completions else None
        self.done = True
