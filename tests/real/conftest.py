"""Fixtures of the real-model tests: the converted model, its template variants, the quick world."""

import pytest

from tests.real.support import require_real


@pytest.fixture(scope="session")
def real_script():
    return require_real()


@pytest.fixture(scope="session")
def real_model(real_script):
    """SmolLM2-135M-Instruct as a plain Hugging Face directory, with its own (ChatML) template."""
    return str(real_script.convert())


@pytest.fixture(scope="session")
def template_models(real_script, real_model):
    """template name -> the model directory with that chat template (tests.helpers.chat_templates)."""
    return {name: str(path) for name, path in real_script.template_variants().items()}


@pytest.fixture(scope="session")
def quick_world(tmp_path_factory):
    """The quick demo world with a BM25 index (seconds to build, no encoder)."""
    from mopd.recipes.tiny_world.world import QUICK_WORLD, WorldSettings, build_world

    return build_world(tmp_path_factory.mktemp("world") / "w",
                       settings=WorldSettings(seed=0, index_kind="bm25", **QUICK_WORLD))
