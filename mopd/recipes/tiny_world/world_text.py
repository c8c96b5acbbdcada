"""The tiny world written out: Wikipedia-style passages and the questions with their gold passages.

Passages are one-sentence stubs ("X is a folk band formed in Ashford in 1994."), so a Searcher's
report can quote one sentence per fact, and a search result costs few tokens (every token of
every prompt is paid for in rollouts and training on a laptop CPU). Distractor passages mention the
same entities in other relations (a tour through other towns, a festival a band played at, a
member's birthplace, a company's factory elsewhere): a careless query or reader lands on a wrong
town. Nothing in a distractor contradicts a gold fact.

Questions: one-hop ("Where was the band X formed?" -> the town) and two-hop ("Which river flows
through the town where the band X was formed?" -> the river), for bands and companies: chains, that
one Searcher walks alone. And two pair types over bands, whose answer needs two independent facts
(as HotpotQA's and 2WikiMultiHopQA's bridge-free conjunction questions), so that two parallel
Searchers pay: towns ("Where were the bands A and B formed?" -> "Ashford and Kelby") and genres
("What music do the bands A and B play?" -> "folk and jazz"), the two bands' values always distinct
and either order accepted. Each half of the answer is one name token copied from one band's
passage: the earlier pair types (which of two bands was formed earlier -> a two-word band name;
same town -> yes / no) asked the 0.7M-parameter Answerer to copy two-token names and to compare two
towns across reports, and every system, scripted-team-trained pi_0 included, sat at or below chance
on them (bench/RESULTS.md, "The demo with pair questions and a control arm").
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from mopd.core.qa import QAExample
from mopd.recipes.tiny_world.world_kb import INDUSTRY_WORDS, KnowledgeBase

ONE_HOP = "tiny_1hop"
TWO_HOP = "tiny_2hop"
PAIR_TOWNS = "tiny_pair_towns"
PAIR_GENRES = "tiny_pair_genres"
CHAIN_DATASETS = (ONE_HOP, TWO_HOP)
PAIR_DATASETS = (PAIR_TOWNS, PAIR_GENRES)
DATASETS = CHAIN_DATASETS + PAIR_DATASETS
"""Every dataset of the tiny world, in the order the splits list them."""

QUESTION_TEMPLATES = {
    ("band", 1): ["Where was the band {s} formed?", "In which town was the band {s} formed?"],
    ("company", 1): ["In which town is the company {s} headquartered?", "Where is the company {s} based?"],
    ("band", 2): ["Which river flows through the town where the band {s} was formed?"],
    ("company", 2): ["Which river flows through the town where the company {s} is headquartered?"],
}

PAIR_TEMPLATES = {
    PAIR_TOWNS: ["Where were the bands {a} and {b} formed?", "In which towns were the bands {a} and {b} formed?"],
    PAIR_GENRES: ["What music do the bands {a} and {b} play?", "Which genres do the bands {a} and {b} play?"],
}
"""Pair questions (bands only; their gold passages state genre, town and year)."""
PAIR_RELATIONS = {PAIR_TOWNS: "town", PAIR_GENRES: "genre"}
"""The band attribute each pair type asks for (a key of ``KnowledgeBase.bands``' records)."""


def pair_answers(first: str, second: str) -> List[str]:
    """The accepted answers of a pair question whose bands have values ``first`` and ``second``:
    both, joined by "and", in either order."""
    return [f"{first} and {second}", f"{second} and {first}"]


@dataclass
class WorldPassage:
    id: str
    title: str
    text: str
    kind: str
    """band | company | town | river (gold kinds) or person | tour | festival | station | factory."""

    def to_corpus_row(self) -> dict:
        return {"id": self.id, "contents": f"{self.title}\n{self.text}"}


@dataclass
class WorldText:
    passages: List[WorldPassage] = field(default_factory=list)
    questions: List[QAExample] = field(default_factory=list)
    gold_of: Dict[str, str] = field(default_factory=dict)
    """Entity name -> id of its gold passage."""


def with_article(word: str) -> str:
    """The indefinite article for ``word``: 'a folk', 'an indie'."""
    return ("an " if word[:1].lower() in "aeiou" else "a ") + word


def _towns_list(towns: List[str]) -> str:
    return towns[0] if len(towns) == 1 else ", ".join(towns[:-1]) + " and " + towns[-1]


def gold_passages(kb: KnowledgeBase, rng: random.Random) -> List[WorldPassage]:
    out: List[WorldPassage] = []
    for i, (b, a) in enumerate(kb.bands.items()):
        m1, m2 = a["members"]
        text = rng.choice([
            f"{b} is {with_article(a['genre'])} band formed in {a['town']} in {a['year']}.",
            f"{b} are {with_article(a['genre'])} group that was formed in {a['town']} in {a['year']} by {m1} and {m2}.",
        ])
        out.append(WorldPassage(f"band-{i:03d}", b, text, "band"))
    for i, (c, a) in enumerate(kb.companies.items()):
        word = INDUSTRY_WORDS[a["industry"]]
        text = rng.choice([
            f"{c} is {with_article(word)} company headquartered in {a['town']}, founded in {a['year']} by {a['founder']}.",
            f"{c} is {with_article(word)} firm with its headquarters in {a['town']}.",
        ])
        out.append(WorldPassage(f"company-{i:03d}", c, text, "company"))
    for i, (t, a) in enumerate(kb.towns.items()):
        text = rng.choice([
            f"{t} is a town on the river {a['river']}, in the {a['region']} region.",
            f"{t} is a market town in {a['region']} that lies on the river {a['river']}.",
        ])
        out.append(WorldPassage(f"town-{i:03d}", t, text, "town"))
    for i, (r, a) in enumerate(kb.rivers.items()):
        text = f"The {r} is a river that flows through {_towns_list(a['towns'])} to {a['sea']}."
        out.append(WorldPassage(f"river-{i:03d}", f"{r} (river)", text, "river"))
    return out


def distractor_passages(kb: KnowledgeBase, rng: random.Random, n: int) -> List[WorldPassage]:
    """``n`` passages: 3/7 people, 3/14 tours, 1/7 festivals, 1/7 stations, the rest factories."""
    towns, bands, companies = list(kb.towns), list(kb.bands), list(kb.companies)
    counts = {"person": n * 3 // 7, "tour": n * 3 // 14, "festival": n // 7, "station": n // 7}
    counts["factory"] = n - sum(counts.values())
    out: List[WorldPassage] = []
    for i, p in enumerate(rng.sample(sorted(kb.people), min(counts["person"], len(kb.people)))):
        a = kb.people[p]
        year = rng.randrange(1930, 1995)
        if a["band"]:
            text = f"{p} is a musician born in {a['born_in']} in {year}, a member of the band {a['band']}."
        else:
            text = f"{p} is a businessperson born in {a['born_in']} in {year} who founded {a['company']}."
        out.append(WorldPassage(f"person-{i:03d}", p, text, "person"))
    for i in range(counts["tour"]):
        b = rng.choice(bands)
        t1, t2 = rng.sample([t for t in towns if t != kb.bands[b]["town"]], 2)
        year = kb.bands[b]["year"] + rng.randrange(1, 8)
        text = f"In {year} {b} toured {t1} and {t2}, playing {rng.randrange(6, 40)} concerts."
        out.append(WorldPassage(f"tour-{i:03d}", f"{b} tour of {year}", text, "tour"))
    for i, t in enumerate(rng.sample(towns, min(counts["festival"], len(towns)))):
        b1, b2 = rng.sample([b for b in bands if kb.bands[b]["town"] != t], 2)
        text = f"The {t} Festival is held each summer in {t}; past headliners include {b1} and {b2}."
        out.append(WorldPassage(f"festival-{i:03d}", f"{t} Festival", text, "festival"))
    for i, t in enumerate(rng.sample(towns, min(counts["station"], len(towns)))):
        t2 = rng.choice([x for x in towns if x != t])
        text = f"{t} Station is a railway station serving {t}, on the line to {t2}."
        out.append(WorldPassage(f"station-{i:03d}", f"{t} Station", text, "station"))
    for i in range(counts["factory"]):
        c = rng.choice(companies)
        t = rng.choice([x for x in towns if x != kb.companies[c]["town"]])
        year, staff = rng.randrange(1900, 2015), rng.randrange(2, 40) * 10
        text = f"The {c} factory in {t} opened in {year} and employs {staff} workers."
        out.append(WorldPassage(f"factory-{i:03d}", f"{c} factory", text, "factory"))
    return out


def world_questions(kb: KnowledgeBase, gold_of: Dict[str, str], rng: random.Random) -> List[QAExample]:
    """A one-hop and a two-hop question about every band and company; ``meta`` holds the subject,
    the hops, the town, the river and the ids of the gold passages."""
    out: List[QAExample] = []
    for kind, table in (("band", kb.bands), ("company", kb.companies)):
        for i, (s, a) in enumerate(table.items()):
            town = a["town"]
            river = kb.towns[town]["river"]
            for hops in (1, 2):
                q = rng.choice(QUESTION_TEMPLATES[(kind, hops)]).format(s=s)
                if hops == 1:
                    answers, gold, dataset = [town], [gold_of[s]], ONE_HOP
                else:
                    answers = [river, f"River {river}", f"{river} River"]
                    gold, dataset = [gold_of[s], gold_of[town], gold_of[river]], TWO_HOP
                meta = {"subject": s, "kind": kind, "hops": hops, "town": town, "river": river, "gold": gold}
                out.append(QAExample(id=f"{dataset}-{kind}-{i:03d}", dataset=dataset, question=q,
                                     answers=answers, meta=meta))
    return out


def _matching(rng: random.Random, bands: List[str], ok, n: int, fill_from: Optional[List[str]] = None) -> List[tuple]:
    """Up to ``n`` distinct pairs (a, b) with ``ok(a, b)``: first a random matching (each band in at
    most one pair, so that held-out pair questions can each have subjects of their own), then, when
    the bands run out (small worlds), random pairs of ``fill_from`` (default: ``bands``) that reuse
    bands; fewer when no more pairs exist."""
    order = bands[:]
    rng.shuffle(order)
    pairs: List[tuple] = []
    used: set = set()
    rest = order
    while rest and len(pairs) < n:
        a, rest = rest[0], rest[1:]
        k = next((j for j, b in enumerate(rest) if ok(a, b)), None)
        if k is None:
            continue
        pairs.append((a, rest[k]))
        used |= {a, rest[k]}
        rest = rest[:k] + rest[k + 1:]
    if len(pairs) < n:
        seen = {frozenset(p) for p in pairs}
        pool = fill_from or bands
        more = [(a, b) for i, a in enumerate(pool) for b in pool[i + 1:]
                if ok(a, b) and frozenset((a, b)) not in seen]
        pairs += [p if rng.random() < 0.5 else p[::-1] for p in rng.sample(more, min(n - len(pairs), len(more)))]
    return pairs


def pair_questions(kb: KnowledgeBase, gold_of: Dict[str, str], rng: random.Random, n: int) -> List[QAExample]:
    """``n`` questions of each pair type (:data:`PAIR_TEMPLATES`) about pairs of bands whose values
    of the asked attribute differ (so each half of the answer is a fact of its own). ``meta``: kind,
    hops 2, subjects [A, B], subject A, relation (town / genre), the two towns, genres and years,
    the answer-deciding gold ids (both bands' passages)."""
    bands = sorted(kb.bands)
    value = {rel: {b: kb.bands[b][rel] for b in bands} for rel in ("town", "genre", "year")}
    out: List[QAExample] = []
    for dataset in PAIR_DATASETS:
        rel = PAIR_RELATIONS[dataset]
        v = value[rel]
        for i, (a, b) in enumerate(_matching(rng, bands, lambda x, y: v[x] != v[y], n)):
            q = rng.choice(PAIR_TEMPLATES[dataset]).format(a=a, b=b)
            meta = {"subject": a, "subjects": [a, b], "kind": "band", "hops": 2, "relation": rel,
                    **{f"{r}s": [value[r][a], value[r][b]] for r in ("town", "genre", "year")},
                    "gold": [gold_of[a], gold_of[b]]}
            out.append(QAExample(id=f"{dataset}-{i:03d}", dataset=dataset, question=q,
                                 answers=pair_answers(v[a], v[b]), meta=meta))
    return out


def write_world_text(kb: KnowledgeBase, seed: int, n_distractors: int, n_pairs: int = 0) -> WorldText:
    rng = random.Random(f"text-{seed}")
    gold = gold_passages(kb, rng)
    gold_of = {}
    for p in gold:
        gold_of[p.title[: -len(" (river)")] if p.kind == "river" else p.title] = p.id
    passages = gold + distractor_passages(kb, rng, n_distractors)
    rng.shuffle(passages)
    questions = world_questions(kb, gold_of, rng)
    # Pair questions from their own stream, so the chain questions stay those of a world without them.
    questions += pair_questions(kb, gold_of, random.Random(f"pairs-{seed}"), n_pairs)
    return WorldText(passages=passages, questions=questions, gold_of=gold_of)
