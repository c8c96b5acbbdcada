"""The core's tests use a test-support copy of the tiny model (tests/helpers/tiny_model.py, so they
stand without this recipe); both build the same model and tokenizer for the same arguments."""

import pytest

from mopd.recipes.tiny_world import tiny_model as recipe_model
from tests.helpers import tiny_model as test_model


@pytest.mark.slow   # two tokenizers trained: ~12 s on the shared 2-core box
def test_the_test_support_copy_builds_the_recipes_model(tmp_path):
    spec = dict(corpus_texts=["the Quenby river passes 1987"], vocab_size=333, hidden=24, layers=1, heads=3,
                ffn=40, seed=7)
    a = recipe_model.init_tiny_model(tmp_path / "recipe", **spec)
    b = test_model.init_tiny_model(tmp_path / "tests", **spec)
    for name in ("model.safetensors", "tokenizer.json", "config.json", "tokenizer_config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
