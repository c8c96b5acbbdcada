"""Fixtures of the real-model tests: the converted model, its template variants, a small search-QA world."""

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
    """A small search-QA world with a BM25 index (tests.helpers.qa_world: seconds to build, no encoder)."""
    from tests.helpers.qa_world import build_qa_world

    return build_qa_world(tmp_path_factory.mktemp("world") / "w")
