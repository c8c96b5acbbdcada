import pytest


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    from mopd.rollout.tiny_model import init_tiny_model

    return init_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def tokenizer(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture(scope="session")
def hf_engine(tiny_dir):
    from mopd.rollout.hf_engine import HFEngine

    return HFEngine.from_pretrained(str(tiny_dir), device="cpu")
