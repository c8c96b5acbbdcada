"""The roles of the team: one table from which every package reads its role list.

A role is its name, its id (its position in the table; packed batches carry it per token and the
fused loss reads ``role_specs[id]``), the system prompt that selects it (one model plays every
role), the stop strings that end its turn, the parser of its action grammar, and how its outcome
advantages are grouped. Prompts, records, rewards, advantages, loss statistics and the warm-start
data all iterate :func:`role_names` instead of naming the roles again.

Adding a role (docs/architecture.md, "Adding a role"): :func:`add_role` here, an agent class that
plays it, and a workflow that calls it. Its tokens then train with the default loss
(``mopd.config.role_loss()``: GRPO on its default reward) unless the config names it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

from mopd.core.actions import Action, parse_answerer, parse_leader, parse_searcher

GROUPINGS = ("trajectory", "request")


@dataclass(frozen=True)
class Role:
    name: str
    """Lower-case name, as written in records (``AgentCall.role``) and config keys."""
    system_prompt: str
    """The system message that tells the shared model which role it plays."""
    stop: Tuple[str, ...]
    """Stop strings: a turn ends as soon as its action is complete (kept in the output)."""
    parse: Callable[..., Action]
    """``parse(text, **state) -> Action``; never raises on malformed output."""
    grouping: str = "trajectory"
    """How its outcome advantages are normalised: ``trajectory`` (one reward per workflow, every
    call of the role takes it, normalised over the G trajectories of one sampled prompt) or
    ``request`` (one reward per call, normalised over the calls of one request, like Answerer
    candidates)."""
    reward: str = ""
    """Its default reward (``reward.roles.<name>``; a name of ``mopd.config.REWARDS``): empty takes
    the outcome of its grouping, ``team`` (R_EM) for a trajectory role and ``candidate_em`` (its
    own answer's EM) for a request role."""

    def __post_init__(self):
        if self.grouping not in GROUPINGS:
            raise ValueError(f"Role.grouping={self.grouping!r}: choose one of {GROUPINGS}")
        if not self.name or self.name != self.name.lower() or not self.name.isidentifier():
            raise ValueError(f"Role.name={self.name!r} must be a lower-case identifier")
        if not self.reward:
            object.__setattr__(self, "reward", "candidate_em" if self.grouping == "request" else "team")


# Each action is shown by a worked example, never a placeholder: real instruct models copy what
# the instructions show, and a copied ``<search>query</search>`` is an invalid action
# (``mopd.core.actions.PLACEHOLDERS``). bench/RESULTS.md, "Zero-shot format validity", measures
# what these prompts get from SmolLM2-135M-Instruct unaided.
SEARCHER_SYSTEM = (
    "You are a Searcher on a question-answering team. You look up evidence with a search engine "
    "and report what you find.\n"
    "In each turn you may first think inside <think></think> tags. Then write exactly one action "
    "and nothing else: a search or a report.\n"
    "A search, for example: <search>Eiffel Tower architect</search>\n"
    "The results come back inside <information></information> tags.\n"
    "A report ends your work, for example: <report>The Eiffel Tower was designed by the company of "
    "Gustave Eiffel.</report>\n"
    "State in it the facts you found that answer your task, with the names, dates and places, so "
    "that a reader who sees only your report can use them."
)

LEADER_SYSTEM = (
    "You are the Leader of a question-answering team. You cannot search yourself; Searchers "
    "search for you and write reports.\n"
    "In each turn you may first think inside <think></think> tags. Then write one kind of action "
    "and nothing else: subtasks or a selection.\n"
    "Each subtask gives one Searcher a self-contained search task; write several to run several "
    "Searchers in parallel, for example: <subtask>Who designed the Eiffel Tower?</subtask>"
    "<subtask>When was the Eiffel Tower completed?</subtask>\n"
    "Their reports come back to you, numbered.\n"
    "A selection ends the work, for example: <select>1,2</select> names the reports the Answerer "
    "should read to answer the question."
)

ANSWERER_SYSTEM = (
    "You are the Answerer of a question-answering team. Searchers have looked up evidence and "
    "written reports. Answer the question from the reports, and from what you know where they "
    "are silent.\n"
    "You may first think inside <think></think> tags. Then give the final answer inside answer "
    "tags, for example: <answer>Gustave Eiffel</answer>\n"
    "Write only the answer, a short phrase such as a name, a date or a number."
)

ROLE_TABLE: Dict[str, Role] = {}
"""Every role by name, in role-id order. Add roles with :func:`add_role`."""


def add_role(role: Role) -> Role:
    """Append ``role`` to the table (its id is the next one). Re-adding the same role is a no-op."""
    old = ROLE_TABLE.get(role.name)
    if old is not None and old != role:
        raise ValueError(f"a different role named {role.name!r} is already in the table")
    if any(r.system_prompt == role.system_prompt for r in ROLE_TABLE.values() if r.name != role.name):
        raise ValueError(f"role {role.name!r}: its system prompt must differ from every other role's")
    ROLE_TABLE[role.name] = role
    return role


def remove_role(name: str) -> None:
    """Take a role added later out of the table again (tests); the built-in roles stay."""
    if name in BUILTIN_ROLES:
        raise ValueError(f"{name!r} is a built-in role")
    ROLE_TABLE.pop(name, None)


def role_names() -> Tuple[str, ...]:
    """Role names in role-id order."""
    return tuple(ROLE_TABLE)


def role_id(name: str) -> int:
    """The id a token of role ``name`` carries in a packed batch."""
    try:
        return list(ROLE_TABLE).index(name)
    except ValueError:
        raise ValueError(f"unknown role {name!r}; roles: {role_names()}") from None


def role(name: str) -> Role:
    if name not in ROLE_TABLE:
        raise ValueError(f"unknown role {name!r}; roles: {role_names()}")
    return ROLE_TABLE[name]


def role_of_prompt(prompt_text: str) -> Optional[str]:
    """The role whose system prompt ``prompt_text`` holds (None when it holds none, e.g. after
    an input-limit cut)."""
    for r in ROLE_TABLE.values():
        if r.system_prompt in prompt_text:
            return r.name
    return None


BUILTIN_ROLES = ("leader", "searcher", "answerer")
add_role(Role("leader", LEADER_SYSTEM, ("</select>",), parse_leader, reward="team_assign"))
add_role(Role("searcher", SEARCHER_SYSTEM, ("</search>", "</report>"), parse_searcher, reward="team_bonus"))
add_role(Role("answerer", ANSWERER_SYSTEM, ("</answer>",), parse_answerer, grouping="request", reward="candidate_em"))
# Stop strings: a Searcher stops at </search> (as Search-R1 does), so the model cannot write
# passages of its own after a query. A Leader's subtask wave has no stop string (several tags)
# and ends with EOS.
