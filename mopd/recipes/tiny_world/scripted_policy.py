"""A scripted, deliberately imperfect team policy for the tiny world, served as an inference engine.

:class:`DemoEngine` implements the :class:`mopd.rollout.engine.Engine` protocol: for each request
it decodes the prompt ids, reads the role and state back from the text
(:mod:`mopd.recipes.tiny_world.prompt_reader`), decides the action like a reasonable but careless agent, and
returns that text tokenised as the model would have written it (EOS appended unless the text
ends with one of the request's stop strings, log-probs 0). Running the real ``run_workflows``
with this engine gives WorkflowRecords whose ``call.token_ids()`` / ``call.loss_mask()`` are
exactly the sequences the model will see and write, so supervised fine-tuning on them
(:mod:`mopd.recipes.tiny_world.warmstart`) teaches the real prompt and action format of all three roles.

The script knows the world (which passage holds which fact) but acts only on what the prompt
shows: a fact counts as found when its gold passage is among the passages returned so far (or,
for the Leader and the Answerer, when its sentence is in a report). Its mistakes (:class:`DemoStyle`):
vague queries that leave out the name, reports with no search at all, reports that quote the wrong
passage, answers that pick the wrong name among the candidates. They leave pi_0 valid in format
but far from perfect, so that outcome RL has something to gain.

Pair questions (both bands' towns or genres: two bands' passages needed) are where the hierarchy has a
job: the H-MAS Leader mostly splits them into one subtask per band, a wave of two Searchers with
three searches each, and re-asks for a fact still missing; a C-MAS Searcher (or an H-MAS Searcher
given both bands in one subtask) must find both facts within one Searcher's three searches. The
Answerer copies both values when both facts are in its reports and writes a name from the reports
(or any name of the kind) for a band whose fact is missing. Chain questions draw the same random numbers in the same order as before.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from mopd.recipes.tiny_world.prompt_reader import Doc, PromptView, read_prompt
from mopd.recipes.tiny_world.world_kb import GENRES, KnowledgeBase
from mopd.recipes.tiny_world.world_text import PAIR_RELATIONS, PAIR_TEMPLATES, QUESTION_TEMPLATES, with_article
from mopd.rollout.sampling import derive_seed
from mopd.rollout.scripted_engine import ScriptedEngine
from mopd.recipes.tiny_world.world import WorldPaths, load_kb
import json


@dataclass(frozen=True)
class DemoStyle:
    """How careless the scripted team is (probabilities of doing the right thing)."""

    good_query: float = 0.8
    """A query naming the entity; otherwise a vague one without the name."""
    right_copy: float = 0.9
    """A report quotes the passage holding the fact; otherwise another passage of that search."""
    right_pick: float = 0.9
    """The Answerer picks the supported answer when the reports hold it; otherwise another name."""
    search_first: float = 0.9
    """A Searcher searches before reporting; otherwise it reports a guess at once."""
    good_subtask: float = 0.9
    """The Leader's subtask names the entity."""
    split_two_hop: float = 0.75
    """The Leader asks the two hops of a two-hop question one after the other (else in one subtask)."""
    split_pair: float = 0.8
    """The Leader splits a pair question (two bands) into one subtask per band, run by two parallel
    Searchers (else one joint subtask naming both, which one Searcher works through)."""
    both_facts: float = 0.6
    """A Searcher whose task needs two independent facts (a pair question in C-MAS, a joint
    subtask in H-MAS) goes on to search the second once it has found the first; otherwise it
    reports the first alone (a single agent stopping half-way, the mistake a Leader's split into
    one fact per Searcher avoids). Without it (1.0) the scripted C-MAS matched H-MAS on pair
    questions: the second Searcher's own mistakes (no search, vague subtask) cost what its
    searches gained (bench/RESULTS.md)."""

    def __post_init__(self):
        for name, value in vars(self).items():
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"DemoStyle.{name}={value} is a probability: choose it in [0, 1]")


# Subtask wordings the Leader writes and the Searcher understands.
SUBTASK_TOWN = {"band": "Find the town where the band {s} was formed.",
                "company": "Find the town where the company {s} is headquartered."}
SUBTASK_TWO_HOP = {"band": "Find which river flows through the town where the band {s} was formed.",
                   "company": "Find which river flows through the town where the company {s} is headquartered."}
SUBTASK_RIVER = "Find the river that flows through {t}."
VAGUE_SUBTASK = {"band": "Find where the band was formed.", "company": "Find where the company is based."}
# Pair questions: the relation each asks about, one band's subtask for it (the town one is
# SUBTASK_TOWN's), the joint subtask naming both bands, and the vague forms without names.
SUBTASK_ONE = {"genre": "Find the music the band {s} plays.", "town": SUBTASK_TOWN["band"]}
SUBTASK_PAIR = {"genre": "Find the music the bands {a} and {b} play.",
                "town": "Find the towns where the bands {a} and {b} were formed."}
VAGUE_ONE = {"genre": "Find what music the band plays.", "town": VAGUE_SUBTASK["band"]}
VAGUE_PAIR = {"genre": "Find what music the bands play.", "town": "Find where the bands were formed."}
PAIR_SUBTASK_TEXTS = list(SUBTASK_ONE.values()) + list(SUBTASK_PAIR.values()) + list(VAGUE_ONE.values()) \
    + list(VAGUE_PAIR.values())
"""Every pair-question subtask wording (the tokenizer learns them)."""
GOOD_QUERIES = {"band": ["{s}", "{s} band", "{s} band formed"], "company": ["{s}", "{s} company", "{s} headquarters"],
                "town": ["{t}", "{t} river", "river through {t}"]}
VAGUE_QUERIES = {"band": ["band formed in town", "{w} band", "where was the band formed"],
                 "company": ["company headquarters", "{w} company", "where is the company based"],
                 "town": ["river through the town", "town on the river", "which river"]}


def answer_text(answer: str) -> str:
    """The Answerer's action, its answer after a space: ``<answer> Ashford</answer>``. A byte-level
    BPE gives a name after ``>`` another token than after a space, and the reports hold the name
    after a space, so written this way the answer is a copy of the very token the report holds
    (the scorer ignores the space). Written ``<answer>Ashford``, pi_0 did not learn to copy towns
    within its 800 SFT steps (bench/RESULTS.md, "Pair questions with one-token answers")."""
    return f"<answer> {answer}</answer>"


def _pattern(template: str) -> re.Pattern:
    parts = template.split("{s}") if "{s}" in template else template.split("{t}")
    return re.compile("^" + "(.+?)".join(re.escape(p) for p in parts) + "$")


def _pair_pattern(template: str) -> re.Pattern:
    """A template with ``{a}`` then ``{b}``."""
    return re.compile("^" + "(.+?)".join(re.escape(p) for p in re.split(r"\{[ab]\}", template)) + "$")


@dataclass(frozen=True)
class Task:
    """What an agent is after: the subject (band/company) and its kind, the hops, or a town whose
    river is wanted (a second-hop subtask). ``subject`` None and ``town`` None: not understood."""

    hops: int
    kind: str = ""
    subject: Optional[str] = None
    town: Optional[str] = None
    relation: str = ""
    """'town' or 'genre' for a pair question or one of its one-band subtasks; '' for chain tasks."""
    pair: Tuple[str, ...] = ()
    """The two bands of a pair question or joint subtask (``subject`` is the first); () otherwise."""
    dataset: str = ""
    """A pair question's dataset (a key of :data:`mopd.recipes.tiny_world.world_text.PAIR_TEMPLATES`)."""


class DemoPolicy:
    """The scripted decisions, one per role; ``act(prompt, rng)`` -> the output text."""

    def __init__(self, kb: KnowledgeBase, first_sentences: Dict[str, str], style: DemoStyle = DemoStyle()):
        """``first_sentences``: passage title -> its first sentence, over the corpus (how the Leader
        and the Answerer recognise a gold fact quoted in a report)."""
        self.kb, self.style = kb, style
        self._gold_sentences = dict(first_sentences)
        self._fits = None
        self._question_patterns = [(_pattern(t), kind, hops)
                                   for (kind, hops), ts in QUESTION_TEMPLATES.items() for t in ts]
        self._subtask_patterns = ([(_pattern(t), k, 1) for k, t in SUBTASK_TOWN.items()]
                                  + [(_pattern(t), k, 2) for k, t in SUBTASK_TWO_HOP.items()])
        self._river_pattern = _pattern(SUBTASK_RIVER)
        self._pair_question_patterns = [(_pair_pattern(t), ds) for ds, ts in PAIR_TEMPLATES.items() for t in ts]
        self._pair_subtask_patterns = [(_pair_pattern(t), rel) for rel, t in SUBTASK_PAIR.items()]
        self._one_patterns = [(_pattern(t), rel) for rel, t in SUBTASK_ONE.items() if rel == "genre"]
        self._town_re = re.compile(r"\b(" + "|".join(map(re.escape, sorted(kb.towns, key=len, reverse=True)))
                                   + r")\b")
        self._river_re = re.compile(r"\b(" + "|".join(map(re.escape, sorted(kb.rivers, key=len, reverse=True)))
                                    + r")\b")
        self._genre_re = re.compile(r"\b(" + "|".join(map(re.escape, GENRES)) + r")\b")

    # ---- understanding ----------------------------------------------------------------
    def task_of_question(self, question: str) -> Task:
        for pat, ds in self._pair_question_patterns:
            m = pat.match(question)
            if m and m.group(1) in self.kb.bands and m.group(2) in self.kb.bands:
                return Task(hops=2, kind="band", subject=m.group(1), relation=PAIR_RELATIONS[ds],
                            pair=(m.group(1), m.group(2)), dataset=ds)
        for pat, kind, hops in self._question_patterns:
            m = pat.match(question)
            if m and m.group(1) in (self.kb.bands if kind == "band" else self.kb.companies):
                return Task(hops=hops, kind=kind, subject=m.group(1))
        return Task(hops=1)

    def task_of_subtask(self, subtask: str) -> Task:
        m = self._river_pattern.match(subtask)
        if m and m.group(1) in self.kb.towns:
            return Task(hops=1, kind="town", town=m.group(1))
        for pat, rel in self._pair_subtask_patterns:
            m = pat.match(subtask)
            if m and m.group(1) in self.kb.bands and m.group(2) in self.kb.bands:
                return Task(hops=2, kind="band", subject=m.group(1), relation=rel, pair=(m.group(1), m.group(2)))
        for pat, rel in self._one_patterns:
            m = pat.match(subtask)
            if m and m.group(1) in self.kb.bands:
                return Task(hops=1, kind="band", subject=m.group(1), relation=rel)
        for pat, kind, hops in self._subtask_patterns:
            m = pat.match(subtask)
            if m and m.group(1) in (self.kb.bands if kind == "band" else self.kb.companies):
                return Task(hops=hops, kind=kind, subject=m.group(1))
        return Task(hops=1)

    def holds_needed_facts(self, question: str, text: str) -> Optional[bool]:
        """Whether ``text`` holds every gold sentence an answer to ``question`` rests on: the
        subject's (and for a two-hop question its town's or that town's river's, either names the
        river), or both bands' for a pair question; None for a question not understood."""
        task = self.task_of_question(question)
        if task.pair:
            return all(self._subject_sentence(s) in text for s in task.pair)
        if task.subject is None:
            return None
        found = self._subject_sentence(task.subject) in text
        if task.hops == 2:
            found = found and any(s in text for s in self._river_sentences(self.home(task.subject)))
        return found

    def home(self, subject: str) -> str:
        return self.kb.subject(subject)["town"]

    def is_subject_doc(self, doc: Doc, subject: str) -> bool:
        return doc.title == subject

    def is_river_doc(self, doc: Doc, town: str) -> bool:
        """The town's own passage or its river's passage (both name the river)."""
        return doc.title == town or doc.title == f"{self.kb.towns[town]['river']} (river)"

    def needs(self, task: Task) -> List[Tuple[str, str]]:
        """The facts to find, in order: ('subject', name) and/or ('town', name). A second hop's town
        is known only once the first hop's passage has been seen (see :meth:`_searcher`)."""
        if task.town:
            return [("town", task.town)]
        if task.pair:
            return [("subject", s) for s in task.pair]
        if task.subject:
            return [("subject", task.subject)] + ([("town", self.home(task.subject))] if task.hops == 2 else [])
        return []

    def _found(self, need: Tuple[str, str], docs: Sequence[Doc]) -> Optional[Doc]:
        kind, name = need
        test = self.is_subject_doc if kind == "subject" else self.is_river_doc
        return next((d for d in docs if test(d, name)), None)

    # ---- roles -----------------------------------------------------------------------
    def fits(self, text: str) -> bool:
        """Whether an output fits the turn's token limit (set per request by the engine)."""
        return self._fits(text) if self._fits is not None else True

    def act(self, prompt: str, rng: random.Random, fits=None) -> str:
        """The output for a decoded prompt; ``fits(text)`` says whether a text fits the turn's
        output limit (a report that would not drops its earlier sentences)."""
        self._fits = fits
        view = read_prompt(prompt)
        return {"searcher": self._searcher, "leader": self._leader, "answerer": self._answerer}[view.role](view, rng)

    def _query(self, need: Tuple[str, str], subject_kind: str, rng: random.Random) -> str:
        kind, name = need
        key = "town" if kind == "town" else subject_kind
        if rng.random() < self.style.good_query:
            return rng.choice(GOOD_QUERIES[key]).format(s=name, t=name)
        word = rng.choice(name.split())
        return rng.choice(VAGUE_QUERIES[key]).format(w=word)

    def _searcher(self, view: PromptView, rng: random.Random) -> str:
        if view.subtask is not None:
            task = self.task_of_subtask(view.subtask)
        else:  # a question (C-MAS), or a subtask shown as the question (H-MAS)
            task = self.task_of_question(view.question)
            if task.subject is None and task.town is None:
                task = self.task_of_subtask(view.question)
        needs = self.needs(task)
        if not view.forced:
            if not view.searches and rng.random() >= self.style.search_first:
                return f"<report>{self._guess(task, rng)}</report>"
            if not needs and not view.searches:  # a task it does not understand: search its words once
                return f"<search>{(view.subtask or view.question).rstrip('.?')}</search>"
            need = self._next_need(needs, view, independent=task.pair)
            if (need is not None and task.pair and need == needs[1] and view.searches
                    and self._found(needs[0], view.searches[-1]) and rng.random() >= self.style.both_facts):
                need = None  # stops at the first fact, just found
            if need is not None:
                return f"<search>{self._query(need, task.kind, rng)}</search>"
        return f"<report>{self._report(needs, view, task, rng)}</report>"

    def _next_need(self, needs, view: PromptView, max_searches: int = 3, max_tries: int = 2,
                   independent: bool = False):
        """The first fact not found yet, when another search for it is allowed: at most
        ``max_searches`` in all and ``max_tries`` per fact; None means report now. A fact's tries
        start after the search that found the fact before it. In a chain a fact whose tries ran
        out ends the search (the next hop depends on it); with ``independent`` facts (a pair
        question) the next fact's tries start after them. A fact already seen counts as found."""
        start = 0
        for need in needs:
            found_at = next((k for k in range(len(view.searches)) if self._found(need, view.searches[k])), None)
            if found_at is not None:
                start = max(start, found_at + 1)
                continue
            tries = len(view.searches) - start
            if tries < max_tries:
                return need if len(view.searches) < max_searches else None
            if not independent:
                return None
            start += max_tries
        return None

    def _report(self, needs, view: PromptView, task: Task, rng: random.Random) -> str:
        sentences = []
        for need in needs:
            for search in view.searches:
                gold = self._found(need, search)
                if gold is None:
                    continue
                others = [d for d in search if d is not gold]
                pick = gold if not others or rng.random() < self.style.right_copy else rng.choice(others)
                sentences.append(pick.first_sentence)
                break
        if not sentences and view.searches and view.searches[-1]:
            sentences.append(view.searches[-1][0].first_sentence)
        if not sentences:
            return self._guess(task, rng)
        sentences = list(dict.fromkeys(sentences))
        while len(sentences) > 1 and not self.fits(f"<report>{' '.join(sentences)}</report>"):
            sentences.pop(0)  # keep the last hop: it holds the answer
        return " ".join(sentences)

    def _guess(self, task: Task, rng: random.Random) -> str:
        """A report written without evidence: a made-up fact of the right shape."""
        town = rng.choice(sorted(self.kb.towns))
        if task.relation:
            year, genre = rng.randrange(1962, 2016), rng.choice(GENRES)
            return " ".join(f"{s} is {with_article(genre)} band formed in {town} in {year}."
                            for s in (task.pair or (task.subject,)))
        if task.kind == "town" and task.town:
            return f"{task.town} is a town on the river {rng.choice(sorted(self.kb.rivers))}."
        if task.subject and task.kind == "company":
            return f"{task.subject} is a company headquartered in {town}."
        if task.subject:
            return f"{task.subject} is a band formed in {town}."
        return "I found nothing about this."

    def _leader(self, view: PromptView, rng: random.Random) -> str:
        task = self.task_of_question(view.question)
        if task.pair:
            return self._pair_leader(view, task, rng)
        texts = [t for _, _, t in view.reports]
        if not view.reports and not view.forced:
            return self._first_subtasks(task, rng)
        rounds = len(view.outputs)
        town_known = task.subject is not None and any(self._subject_sentence(task.subject) in t for t in texts)
        river_known = (task.subject is not None and task.hops == 2
                       and any(s in t for t in texts for s in self._river_sentences(self.home(task.subject))))
        if not view.forced and task.subject is not None:
            if task.hops == 1 and not town_known and rounds < 2:
                return self._subtask(SUBTASK_TOWN[task.kind].format(s=task.subject), task, rng)
            if task.hops == 2 and not river_known:
                if town_known and rounds < 3:
                    return f"<subtask>{SUBTASK_RIVER.format(t=self.home(task.subject))}</subtask>"
                if not town_known and rounds < 2:
                    return self._subtask(SUBTASK_TOWN[task.kind].format(s=task.subject), task, rng)
        useful = [i for i, _, t in view.reports if t and (
            task.subject is not None and (self._subject_sentence(task.subject) in t
                                          or any(s in t for s in self._river_sentences(self.home(task.subject)))))]
        return self._select(useful, view, rng)

    def _select(self, useful: List[int], view: PromptView, rng: random.Random) -> str:
        """Mostly the useful reports (0.8), else all of them."""
        chosen = useful if useful and rng.random() < 0.8 else [i for i, _, _ in view.reports]
        if not chosen:
            chosen = [1] if view.reports else []
        if not chosen:  # forced with no reports at all: nothing valid to select
            return "<select>1</select>"
        return f"<select>{','.join(map(str, chosen))}</select>"

    def _pair_leader(self, view: PromptView, task: Task, rng: random.Random) -> str:
        """First round: one subtask per band (``split_pair``) or one joint subtask; later, while
        rounds allow (``rounds < 2``, as for a one-hop question), re-ask for each band whose fact
        no report holds yet; then select the reports that hold either fact."""
        if not view.reports and not view.forced:
            if rng.random() < self.style.split_pair:
                return "".join(self._one_band_subtask(s, task, rng) for s in task.pair)
            a, b = task.pair
            text = SUBTASK_PAIR[task.relation].format(a=a, b=b)
            return f"<subtask>{text if rng.random() < self.style.good_subtask else VAGUE_PAIR[task.relation]}</subtask>"
        texts = [t for _, _, t in view.reports]
        missing = [s for s in task.pair if not any(self._subject_sentence(s) in t for t in texts)]
        if not view.forced and missing and len(view.outputs) < 2:
            return "".join(self._one_band_subtask(s, task, rng) for s in missing)
        useful = [i for i, _, t in view.reports if t and any(self._subject_sentence(s) in t for s in task.pair)]
        return self._select(useful, view, rng)

    def _one_band_subtask(self, band: str, task: Task, rng: random.Random) -> str:
        text = SUBTASK_ONE[task.relation].format(s=band)
        return f"<subtask>{text if rng.random() < self.style.good_subtask else VAGUE_ONE[task.relation]}</subtask>"

    def _subtask(self, text: str, task: Task, rng: random.Random) -> str:
        if rng.random() >= self.style.good_subtask:
            text = VAGUE_SUBTASK[task.kind]
        return f"<subtask>{text}</subtask>"

    def _first_subtasks(self, task: Task, rng: random.Random) -> str:
        if task.subject is None:
            return "<subtask>Find the answer to the question.</subtask>"
        if task.hops == 2 and rng.random() >= self.style.split_two_hop:
            return self._subtask(SUBTASK_TWO_HOP[task.kind].format(s=task.subject), task, rng)
        return self._subtask(SUBTASK_TOWN[task.kind].format(s=task.subject), task, rng)

    def _subject_sentence(self, subject: str) -> str:
        return self._gold_sentences.get(subject, "\0")

    def _river_sentences(self, town: str) -> List[str]:
        river = self.kb.towns[town]["river"]
        return [self._gold_sentences.get(town, "\0"), self._gold_sentences.get(f"{river} (river)", "\0")]

    def _answerer(self, view: PromptView, rng: random.Random) -> str:
        task = self.task_of_question(view.question)
        text = " ".join(t for _, _, t in view.reports)
        if task.subject is None:
            names = self._town_re.findall(text) + self._river_re.findall(text)
            return answer_text(names[0] if names else rng.choice(sorted(self.kb.towns)))
        if task.pair:
            return answer_text(self._pair_answer(task, text, rng))
        town = self.home(task.subject)
        if task.hops == 1:
            right, pool, mentioned = town, sorted(self.kb.towns), self._town_re.findall(text)
            supported = self._subject_sentence(task.subject) in text
        else:
            right, pool = self.kb.towns[town]["river"], sorted(self.kb.rivers)
            mentioned = self._river_re.findall(text) + self._town_re.findall(text)
            supported = any(s in text for s in self._river_sentences(town))
        wrong = [n for n in dict.fromkeys(mentioned) if n != right]
        if supported and rng.random() < self.style.right_pick:
            pick = right
        elif wrong:
            pick = rng.choice(wrong)
        elif supported:
            pick = rng.choice([n for n in pool if n != right])
        else:
            pick = rng.choice(mentioned or pool)
        return answer_text(pick)


    def _pair_answer(self, task: Task, text: str, rng: random.Random) -> str:
        """Each band's value, in the question's order: copied when the band's fact is in the reports
        (the pair as a whole right with ``right_pick``, else one half swapped for another name),
        else a name of that kind the reports mention, or any (a guess)."""
        name_re, pool = (self._town_re, sorted(self.kb.towns)) if task.relation == "town" else (self._genre_re, GENRES)
        right = [self.kb.bands[s][task.relation] for s in task.pair]
        wrong = [n for n in dict.fromkeys(name_re.findall(text)) if n not in right]
        found = [self._subject_sentence(s) in text for s in task.pair]
        known = {v for v, ok in zip(right, found) if ok}
        guesses = [n for n in pool if n not in known]  # a guess never repeats the other half
        parts = [v if ok else rng.choice(wrong or guesses) for v, ok in zip(right, found)]
        if all(found) and rng.random() >= self.style.right_pick:
            parts[rng.randrange(2)] = rng.choice(wrong or [n for n in pool if n not in right])
        return " and ".join(parts)


def world_policy(world_dir, style: DemoStyle = DemoStyle()) -> DemoPolicy:
    """The scripted policy of a world built by :func:`mopd.recipes.tiny_world.world.build_world`."""


    paths = WorldPaths.of(world_dir)
    firsts = {}
    with paths.corpus.open(encoding="utf-8") as f:
        for line in f:
            title, _, text = json.loads(line)["contents"].partition("\n")
            firsts[title] = Doc(title, text).first_sentence
    return DemoPolicy(load_kb(paths), firsts, style)


class DemoEngine(ScriptedEngine):
    """The Engine protocol over :class:`DemoPolicy`. Deterministic: sample j of a request draws
    from ``Random(derive_seed(seed, request seed, j))``."""

    def __init__(self, policy: DemoPolicy, tokenizer, seed: int = 0):
        super().__init__(tokenizer, self._respond, record_batches=False)
        self.policy, self.seed = policy, seed

    def _count(self, text: str) -> int:
        if self._fast is not None:
            return len(self._fast.encode(text, add_special_tokens=False).ids)
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def _respond(self, prompt: str, params) -> List[str]:
        fits = lambda text, limit=params.max_new_tokens: self._count(text) < limit  # noqa: E731
        return [self.policy.act(prompt, random.Random(derive_seed(self.seed, params.seed, j)), fits)
                for j in range(params.n)]
