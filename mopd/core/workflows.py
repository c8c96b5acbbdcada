"""The workflows a team can run: one table from which the config, the command line and the
method summary read the workflow names, the roles each one runs and its step limit.

The state machine that runs each workflow is in :mod:`mopd.rollout`, registered against its entry
here where it is written (``@register_state_machine("cmas")``, ``mopd.rollout.run_state``; a test
checks every entry has one). Adding a workflow (docs/architecture.md): an entry here
(:func:`add_workflow`) and its state machine with that decorator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

from mopd.core.roles import role_names


@dataclass(frozen=True)
class Workflow:
    name: str
    """Lower-case name, as written in configs (``rollout.workflow``), records and commands."""
    roles: Tuple[str, ...]
    """The roles it runs, in the order they act (names of :mod:`mopd.core.roles`' table)."""
    max_steps: int
    """The paper's environment-step limit (the presets' ``rollout.max_steps``, and the limit an
    evaluation of this workflow falls back to when the config is another workflow's)."""
    description: str
    """One line for help texts and ``mopd describe``."""
    min_steps: int = 1
    """The fewest environment steps a run of it can finish in (``rollout.max_steps`` below it is
    refused when the config is built)."""

    def __post_init__(self):
        if not self.name or self.name != self.name.lower() or not self.name.isidentifier():
            raise ValueError(f"Workflow.name={self.name!r} must be a lower-case identifier")
        if not self.roles:
            raise ValueError(f"workflow {self.name!r} runs no role")
        if not 1 <= self.min_steps <= self.max_steps:
            raise ValueError(f"workflow {self.name!r}: max_steps={self.max_steps} and min_steps={self.min_steps} "
                             "must satisfy 1 <= min_steps <= max_steps")


WORKFLOW_TABLE: Dict[str, Workflow] = {}
"""Every workflow by name. Add workflows with :func:`add_workflow`."""


def add_workflow(w: Workflow) -> Workflow:
    """Add ``w`` to the table (its roles must be in the role table); re-adding it is a no-op."""
    unknown = [r for r in w.roles if r not in role_names()]
    if unknown:
        raise ValueError(f"workflow {w.name!r}: roles {unknown} are not in the role table {list(role_names())}")
    old = WORKFLOW_TABLE.get(w.name)
    if old is not None and old != w:
        raise ValueError(f"a different workflow named {w.name!r} is already in the table")
    WORKFLOW_TABLE[w.name] = w
    return w


def remove_workflow(name: str) -> None:
    """Take a workflow added later out of the table again (tests); the built-in ones stay."""
    if name in BUILTIN_WORKFLOWS:
        raise ValueError(f"{name!r} is a built-in workflow")
    WORKFLOW_TABLE.pop(name, None)


def workflow_names() -> Tuple[str, ...]:
    return tuple(WORKFLOW_TABLE)


def workflow(name: str) -> Workflow:
    if name not in WORKFLOW_TABLE:
        raise ValueError(f"unknown workflow {name!r}; choose one of {list(WORKFLOW_TABLE)}")
    return WORKFLOW_TABLE[name]


BUILTIN_WORKFLOWS = ("cmas", "hmas")
add_workflow(Workflow("cmas", ("searcher", "answerer"), 5, "Searcher -> Answerer cascade (C-MAS)",
                      min_steps=2))   # one Searcher step and the Answerer's
add_workflow(Workflow("hmas", ("leader", "searcher", "answerer"), 12,
                      "Leader -> waves of Searchers -> Answerer (H-MAS; also 5 delegation rounds)",
                      min_steps=2))   # a Leader step and the Answerer's
