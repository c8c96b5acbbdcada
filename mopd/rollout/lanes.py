"""Agents that act side by side inside one run, each on its own logical steps (an H-MAS wave's
Searchers).

A :class:`Lane` wraps one Searcher with the step of its next turn. Its sub-steps are the agent's
own: :meth:`Lane.begin` (the turn's request, or None when the agent had to end without a turn),
the turn's completions (``Turn.deliver``), :meth:`Lane.search` (the query to run, if any) and
:meth:`Lane.end_turn`. Every sub-step runs at the lane's step (``RunContext.step`` is set to it
first), so an event or a call records the step that lock-step rounds give it: the k-th turn of a
Searcher whose wave starts at step s is at step s+k-1, whenever it actually runs.

The lock-step scheduler runs the lanes' sub-steps in rounds (every begin, every completion, every
search, every end); the asynchronous one runs each lane on its own, so a Searcher's next turn
starts as soon as its own search returns. Either way :func:`merge_events` puts the lanes' events
in round order (by step, then sub-step: turn, completion, search; then lane), the order rounds
emit them in, so the records do not depend on the driver.
"""

from __future__ import annotations

from collections.abc import Sequence

from mopd.rollout.agents import Searcher
from mopd.rollout.run_state import RunContext, SearchNeed, Turn

BEGIN, RECEIVE, SEARCH = 0, 1, 2
"""Sub-steps of a turn, in the order rounds run them."""


class Lane:
    """One Searcher with its own step. ``index``: its place in the wave (ties between lanes at the
    same step and sub-step go in this order); ``force_at``: the first step at which it must report."""

    def __init__(self, ctx: RunContext, searcher: Searcher, index: int, step: int, force_at: int):
        self.ctx, self.searcher, self.index = ctx, searcher, index
        self.step = step
        """The step of its next turn (after its last one: the step after it, or the step at which
        it had to end without a turn)."""
        self.force_at = force_at
        self.tagged: list = []
        """(order key, event) of every event its sub-steps recorded."""
        self._in_turn = False

    @property
    def done(self) -> bool:
        return self.searcher.done

    def _at(self, sub_step: int, fn, *args):
        """Run one sub-step of the agent at this lane's step; tag the events it records."""
        ctx = self.ctx
        ctx.step = self.step
        events = ctx.record.events
        first = len(events)
        out = fn(*args)
        key = (self.step, sub_step, self.index)
        self.tagged.extend((key, e) for e in events[first:])
        return out

    def begin(self) -> Turn | None:
        """This step's turn; None when the Searcher had to end instead (input limit)."""
        request = self._at(BEGIN, self.searcher.turn, self.step >= self.force_at)
        if request is None:
            return None
        self._in_turn = True
        return Turn(request, self.receive)

    def receive(self, completions) -> None:
        self._at(RECEIVE, self.searcher.receive, completions)

    def search(self) -> SearchNeed | None:
        """The search this turn asked for (None: it asked none, or it was not run)."""
        if self.searcher.pending_query is None:
            return None
        return SearchNeed(self.searcher.pending_query, self.deliver)

    def deliver(self, passages) -> None:
        self._at(SEARCH, self.searcher.deliver, passages)

    def end_turn(self) -> None:
        """The turn begun at this step is over (its completions and search delivered)."""
        if self._in_turn:
            self.step += 1
            self._in_turn = False


def merge_events(ctx: RunContext, first: int, lanes: Sequence[Lane]) -> None:
    """Put the events recorded since index ``first`` (all of them the lanes') in round order."""
    tagged: list = sorted((t for lane in lanes for t in lane.tagged), key=lambda t: t[0])  # stable
    events = ctx.record.events
    if len(tagged) != len(events) - first:
        raise RuntimeError(f"{len(events) - first} events since the wave began, {len(tagged)} of them its lanes'")
    events[first:] = [e for _, e in tagged]
