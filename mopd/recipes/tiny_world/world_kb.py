"""The tiny world's knowledge base: invented entities and the relations the questions ask about.

Entities: towns (each on one river), rivers (each through several towns), bands (formed in a
town), companies (headquartered in a town) and people (band members, company founders). Names
are invented from small word and syllable lists, so no fact can be known from outside the
world: the only way to answer is to search its corpus. Band names share their words
("Copper Lanterns", "Copper Wolves", "Silver Lanterns") and some bands have a near-twin
("Copper Lantern"), so a vague query or a careless reader picks the wrong entity.

Everything is drawn from one ``random.Random(seed)``: the same seed gives the same world.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

TOWN_HEADS = ["Ash", "Brack", "Cald", "Dun", "Elm", "Fen", "Gar", "Hal", "Kel", "Lor", "Mar", "Nor", "Oak", "Pel",
              "Rav", "Sel", "Thorn", "Vel", "Wren", "Brom"]
TOWN_TAILS = ["ford", "wick", "bury", "ham", "ton", "mere", "by", "port"]
RIVER_SYLLABLES = [("V", "Ors", "T", "El", "Gr", "M"), ("a", "e", "i", "ae"), ("rn", "lsk", "ssa", "ven", "dle")]
BAND_ADJECTIVES = ["Copper", "Silver", "Velvet", "Hollow", "Paper", "Broken", "Electric", "Midnight", "Golden",
                   "Crimson", "Quiet", "Wild", "Iron", "Glass", "Neon", "Lucky", "Northern", "Salt", "Amber",
                   "Static", "Pale", "Burning", "Frozen", "Little", "Secret", "Wandering", "Rusty", "Solar",
                   "Marble", "Lonely"]
BAND_NOUNS = ["Lanterns", "Wolves", "Sparrows", "Engines", "Harbours", "Ghosts", "Rivers", "Foxes", "Mirrors",
              "Pilots", "Comets", "Bells", "Anchors", "Orchards", "Tigers", "Satellites", "Dolls", "Ravens",
              "Kites", "Giants", "Lions", "Shadows", "Sailors", "Arrows", "Crowns", "Owls", "Horses", "Clouds",
              "Machines", "Captains"]
GENRES = ["rock", "folk", "jazz", "punk", "pop", "indie", "metal", "soul", "blues", "electronic"]
FIRST_NAMES = ["Ada", "Bram", "Cora", "Dario", "Edda", "Finn", "Greta", "Hugo", "Ines", "Jonas", "Kaia",
               "Leon", "Mira", "Nils", "Olga", "Piet", "Rosa", "Stellan", "Tove", "Ugo", "Vera", "Wim",
               "Yara", "Zeno", "Alma", "Boris", "Clea", "Emil", "Frida", "Ivo"]
SURNAMES = ["Halvard", "Brommel", "Castell", "Dorne", "Eskil", "Farrow", "Gisborn", "Holt", "Ivers", "Jansky",
            "Kestrel", "Lindqvist", "Morrow", "Nyberg", "Ostrand", "Pellow", "Quist", "Rennick", "Sorrel",
            "Tamsin", "Ulver", "Vance", "Wexley", "Yelland", "Zorn", "Abbot", "Birk", "Corwin", "Dalby", "Everly"]
INDUSTRIES = ["Textiles", "Foods", "Shipping", "Instruments", "Ceramics", "Printing", "Optics", "Brewing",
              "Engineering", "Paper Mills", "Glassworks", "Motors"]
INDUSTRY_WORDS = {"Textiles": "textile", "Foods": "food", "Shipping": "shipping", "Instruments": "instrument",
                  "Ceramics": "ceramics", "Printing": "printing", "Optics": "optics", "Brewing": "brewing",
                  "Engineering": "engineering", "Paper Mills": "paper", "Glassworks": "glass", "Motors": "motor"}
REGIONS = ["Westmarch", "Hollowvale", "Eastreach", "Lowmark", "Northmoor", "Downland"]
HILLS = ["Grey", "Heather", "Stone", "Blue", "Wether", "High"]
SEAS = ["the Narrow Sea", "the Grey Sea", "the Bight of Sull"]


def name_vocabulary() -> List[str]:
    """Every name any world can use (all 160 towns, all 120 rivers, the words of band, people's
    and company names): the tokenizer of pi_0 learns each as one token, so copying a name from
    the prompt is copying one token, which the tiny model learns within the warm-start budget
    (two-piece town names were copied by their first piece only)."""
    towns = [h + t for h in TOWN_HEADS for t in TOWN_TAILS]
    rivers = ["".join(p) for p in itertools.product(*RIVER_SYLLABLES)]
    singular = [n[:-1] for n in BAND_NOUNS]
    words = [w for i in INDUSTRIES for w in i.split()]
    return towns + rivers + BAND_ADJECTIVES + BAND_NOUNS + singular + FIRST_NAMES + SURNAMES + words + REGIONS + GENRES


@dataclass
class WorldSizes:
    bands: int = 200
    companies: int = 40
    towns: int = 60
    rivers: int = 20
    twins: int = 16
    """Bands given a near-twin name (singular noun) among the ``bands``."""


@dataclass
class KnowledgeBase:
    """Plain data: names, attributes and relations (JSON round-trips through ``to_dict``)."""

    towns: Dict[str, dict] = field(default_factory=dict)
    """town -> {river, region, population}."""
    rivers: Dict[str, dict] = field(default_factory=dict)
    """river -> {towns (in order downstream), hills, sea, length_km}."""
    bands: Dict[str, dict] = field(default_factory=dict)
    """band -> {town, year, genre, members [2 people], albums}."""
    companies: Dict[str, dict] = field(default_factory=dict)
    """company -> {town, year, founder, industry, employees}."""
    people: Dict[str, dict] = field(default_factory=dict)
    """person -> {born_in (a town, usually not the band's), band or company}."""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "KnowledgeBase":
        return cls(**{k: dict(v) for k, v in d.items()})

    def subject(self, name: str) -> dict:
        """A band or company record by name."""
        return self.bands.get(name) or self.companies[name]


def _unique(rng: random.Random, make, n: int, taken: set) -> List[str]:
    out: List[str] = []
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 100 * n + 1000:
            raise ValueError(f"cannot draw {n} distinct names from the word lists; ask for fewer")
        name = make()
        if name not in taken:
            taken.add(name)
            out.append(name)
    return out


def generate_kb(seed: int = 0, sizes: Optional[WorldSizes] = None) -> KnowledgeBase:
    """Draw a world (default sizes: :class:`WorldSizes`). Every town gets a river, every river at
    least one town."""
    sizes = sizes or WorldSizes()
    if sizes.rivers > sizes.towns:
        raise ValueError("need at least as many towns as rivers (every river flows through a town)")
    if sizes.twins * 2 > sizes.bands:
        raise ValueError("twins must be at most half of the bands")
    rng = random.Random(seed)
    taken: set = set()
    towns = _unique(rng, lambda: rng.choice(TOWN_HEADS) + rng.choice(TOWN_TAILS), sizes.towns, taken)
    rivers = _unique(rng, lambda: "".join(rng.choice(part) for part in RIVER_SYLLABLES), sizes.rivers, taken)
    kb = KnowledgeBase()
    # Rivers through towns: a shuffled round-robin, so each river has towns/rivers towns (+-1).
    order = towns[:]
    rng.shuffle(order)
    by_river: Dict[str, List[str]] = {r: [] for r in rivers}
    for i, t in enumerate(order):
        by_river[rivers[i % len(rivers)]].append(t)
    for r in rivers:
        kb.rivers[r] = {"towns": by_river[r], "hills": rng.choice(HILLS), "sea": rng.choice(SEAS),
                        "length_km": rng.randrange(40, 400)}
        for t in by_river[r]:
            kb.towns[t] = {"river": r, "region": rng.choice(REGIONS), "population": rng.randrange(2, 90) * 1000}

    n_plain = sizes.bands - sizes.twins
    bands = _unique(rng, lambda: f"{rng.choice(BAND_ADJECTIVES)} {rng.choice(BAND_NOUNS)}", n_plain, taken)
    twins = []
    for b in rng.sample(bands, sizes.twins):
        adj, noun = b.split(" ", 1)
        twin = f"{adj} {noun[:-1]}"  # "Copper Lanterns" -> "Copper Lantern"
        if twin not in taken:
            taken.add(twin)
            twins.append(twin)
    people = _unique(rng, lambda: f"{rng.choice(FIRST_NAMES)} {rng.choice(SURNAMES)}",
                     2 * (len(bands) + len(twins)) + sizes.companies, taken)
    p = iter(people)
    # Home towns dealt evenly (each town is home to about the same number of bands and companies),
    # so that every town is the answer of several questions whatever the split.
    n_subjects = len(bands) + len(twins) + sizes.companies
    homes = (towns * (n_subjects // len(towns) + 1))[:n_subjects]
    rng.shuffle(homes)
    home = iter(homes)
    for b in bands + twins:
        members = [next(p), next(p)]
        town = next(home)
        kb.bands[b] = {"town": town, "year": rng.randrange(1962, 2016), "genre": rng.choice(GENRES),
                       "members": members, "albums": rng.randrange(1, 9)}
        for m in members:
            kb.people[m] = {"born_in": rng.choice([t for t in towns if t != town]), "band": b, "company": ""}
    companies = _unique(rng, lambda: f"{rng.choice(SURNAMES)} {rng.choice(INDUSTRIES)}", sizes.companies, taken)
    for c in companies:
        founder = next(p)
        town = next(home)
        kb.companies[c] = {"town": town, "year": rng.randrange(1840, 2001), "founder": founder,
                           "industry": c.split(" ", 1)[1], "employees": rng.randrange(2, 60) * 50}
        kb.people[founder] = {"born_in": rng.choice([t for t in towns if t != town]), "band": "", "company": c}
    return kb
