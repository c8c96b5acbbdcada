"""Generate the bundled corpus ``bundled_corpus.jsonl``: short encyclopedia passages about an
invented archipelago (islands, towns, people, ships, instruments, festivals, plants).

Everything is made up from syllables and sentence templates with a fixed seed, so the file is
ours, reproducible (``python -m mopd.retriever.data.make_bundled_corpus``) and small. Each
passage is ``title\\ntext`` in FlashRAG's ``contents`` field; titles are unique and texts are
short (well under the 256-token limit of the MiniLM encoder) so each passage embeds distinctly.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).with_name("bundled_corpus.jsonl")
SEED = 20261129

_ONSETS = ["b", "br", "c", "d", "dr", "f", "g", "gl", "h", "k", "kr", "l", "m", "n", "p", "pr", "r", "s",
           "st", "t", "th", "tr", "v", "w", "z", "sk", "sh", "ch"]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ei", "ou", "ia", "y"]
_CODAS = ["", "", "n", "r", "l", "s", "th", "k", "m", "nd", "rn", "x"]

_KINDS = ["island", "town", "person", "ship", "instrument", "festival", "plant", "river"]
_COLOURS = ["amber", "grey", "crimson", "pale green", "indigo", "ochre", "silver", "white", "copper"]
_TRADES = ["salt", "timber", "wool", "copper", "glass", "spices", "dyes", "paper", "fish", "honey"]
_JOBS = ["cartographer", "poet", "astronomer", "shipwright", "botanist", "composer", "physician",
         "lighthouse keeper", "weaver", "mathematician", "historian", "glassblower"]
_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
           "October", "November", "December"]


def _name(rng: random.Random, syllables: int) -> str:
    s = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)) + rng.choice(_CODAS)
    return s.capitalize()


def _unique_names(rng: random.Random, n: int, taken: set) -> list:
    out = []
    while len(out) < n:
        nm = _name(rng, rng.choice([2, 2, 3]))
        if nm not in taken and len(nm) >= 4:
            taken.add(nm)
            out.append(nm)
    return out


def generate(n_passages: int = 2400, seed: int = SEED) -> list:
    rng = random.Random(seed)
    taken: set = set()
    islands = _unique_names(rng, 40, taken)
    towns = _unique_names(rng, 300, taken)
    rivers = _unique_names(rng, 60, taken)
    people_first = _unique_names(rng, 400, taken)
    people_last = _unique_names(rng, 400, taken)
    town_island = {t: rng.choice(islands) for t in towns}
    rows = []

    titles: set = set()

    def add(title, text):
        titles.add(title)
        rows.append({"id": str(len(rows)), "contents": f"{title}\n{text}"})

    for isl in islands:
        ts = [t for t in towns if town_island[t] == isl][:3] or [rng.choice(towns)]
        add(f"{isl} (island)",
            f"{isl} is an island of the Velmora archipelago covering {rng.randint(40, 2400)} square "
            f"kilometres. Its largest town is {ts[0]}, and its main exports are "
            f"{' and '.join(rng.sample(_TRADES, 2))}. The highest point, Mount {_name(rng, 2)}, rises {rng.randint(300, 2900)} metres.")
    for t in towns:
        add(f"{t}", f"{t} is a harbour town on the island of {town_island[t]}, founded in "
                    f"{rng.randint(900, 1850)}. About {rng.randint(2, 90) * 1000} people live there. The town is "
                    f"known for its {rng.choice(_COLOURS)} roofs and its {rng.choice(_TRADES)} market.")
    for r in rivers:
        through = rng.sample(towns, 2)
        add(f"{r} River", f"The {r} is a river of {town_island[through[0]]}, {rng.randint(12, 310)} kilometres "
                          f"long. It flows through {through[0]} and {through[1]} before reaching the "
                          f"{rng.choice(['northern', 'southern', 'eastern', 'western'])} sea.")
    kind_cycle = ["person", "person", "ship", "instrument", "festival", "plant"]
    i = 0
    while len(rows) < n_passages:
        kind = kind_cycle[i % len(kind_cycle)]
        i += 1
        town = rng.choice(towns)
        if kind == "person":
            first, last = rng.choice(people_first), rng.choice(people_last)
            title = f"{first} {last}"
            job = rng.choice(_JOBS)
            born = rng.randint(1400, 1950)
            text = (f"{first} {last} ({born}-{born + rng.randint(30, 95)}) was a {job} born in {town}. "
                    f"{last} is best remembered for {rng.choice(['a treatise', 'a map', 'a song cycle', 'a survey', 'a catalogue'])} "
                    f"on the {rng.choice(_TRADES)} trade of {town_island[town]}, written in {born + rng.randint(20, 29)}.")
        elif kind == "ship":
            title = f"{_name(rng, 2)} ({'schooner' if rng.random() < 0.5 else 'brig'})"
            text = (f"The {title.split(' (')[0]} was a ship built at {town} in {rng.randint(1600, 1920)}. "
                    f"She carried {rng.choice(_TRADES)} between {town_island[town]} and {rng.choice(islands)} "
                    f"and was painted {rng.choice(_COLOURS)}. She sank in a storm in {rng.choice(_MONTHS)}.")
        elif kind == "instrument":
            title = f"{_name(rng, 2)} (instrument)"
            text = (f"The {title.split(' (')[0].lower()} is a {rng.randint(3, 24)}-string instrument from "
                    f"{town_island[town]}, carved from {rng.choice(['pine', 'olive', 'cedar', 'driftwood', 'ash'])}. "
                    f"It is played at weddings in {town} and tuned to the note {rng.choice('ABCDEFG')}.")
        elif kind == "festival":
            title = f"{_name(rng, 2)} Festival"
            text = (f"The {title} is held every {rng.choice(_MONTHS)} in {town}. Visitors light "
                    f"{rng.choice(_COLOURS)} lanterns and share {rng.choice(['bread', 'fish stew', 'honey cakes', 'plum wine'])} "
                    f"to remember the founding of the town. The first festival took place in {rng.randint(1100, 1900)}.")
        else:
            title = f"{_name(rng, 2)} {rng.choice(['fern', 'lily', 'thorn', 'moss', 'palm', 'vine'])}"
            text = (f"The {title.lower()} is a plant that grows only near {town} on {town_island[town]}. "
                    f"It has {rng.choice(_COLOURS)} flowers, reaches {rng.randint(5, 400)} centimetres and is "
                    f"used to make {rng.choice(_TRADES)} dye.")
        if title in titles:
            continue
        add(title, text)
    return rows


def main() -> None:
    rows = generate()
    with OUT.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} passages to {OUT} ({OUT.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
