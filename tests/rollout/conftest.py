import pytest


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    from tests.helpers.tiny_model import init_tiny_model

    return init_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def tokenizer(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture(scope="session")
def hf_engine(tiny_dir):
    from mopd.rollout.hf_engine import HFEngine

    return HFEngine.from_pretrained(str(tiny_dir), device="cpu")


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """The tiny model is far too small to gain from intra-op threads, and on a shared 2-core box
    spinning worker threads make each step many times slower; restored after each test."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
