"""One KEY=VALUE parser for the demo's --world and --pi0 settings."""

from dataclasses import dataclass
from typing import Optional

import pytest

from mopd.core.key_values import parse_key_values


@dataclass
class Recipe:
    steps: int = 800
    search_first: float = 0.6
    index_kind: str = "flat"
    lockstep: bool = True
    max_questions: Optional[int] = None
    seed: int = 0


def test_values_take_the_type_of_their_default():
    got = parse_key_values(["steps=613", "search_first=0.35", "index_kind=bm25", "lockstep=false",
                            "max_questions=17", "steps=41"], Recipe, what="pi_0")
    assert got == {"steps": 41, "search_first": 0.35, "index_kind": "bm25", "lockstep": False,
                   "max_questions": 17}
    assert type(got["search_first"]) is float and got["lockstep"] is False
    assert parse_key_values(["max_questions=None", "lockstep=YES"], Recipe, what="x") == {
        "max_questions": None, "lockstep": True}


@pytest.mark.parametrize("item,message", [
    ("seed=3", "expected KEY=VALUE with KEY one of"), ("steps", "expected KEY=VALUE"),
    ("bands=400", "KEY one of ['index_kind', 'lockstep'"), ("steps=ten", "'ten' is not a int"),
    ("lockstep=maybe", "is not a bool"), ("max_questions=all", "is not a int (or none)")])
def test_bad_entries_are_named(item, message):
    with pytest.raises(ValueError, match=r"world setting '.*': ") as e:
        parse_key_values([item], Recipe, what="world", exclude=("seed",))
    assert message in str(e.value) and item in str(e.value)
