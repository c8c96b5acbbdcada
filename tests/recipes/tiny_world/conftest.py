import pytest


@pytest.fixture(scope="session")
def world(tmp_path_factory):
    """The default tiny world with a BM25 index (about a second to build)."""
    from mopd.recipes.tiny_world.world import build_world

    return build_world(tmp_path_factory.mktemp("world") / "w", seed=0, index_kind="bm25")


@pytest.fixture(scope="session")
def world_tokenizer(world):
    from mopd.recipes.tiny_world.tiny_model import default_corpus, train_tokenizer
    from mopd.recipes.tiny_world.warmstart import tokenizer_texts

    return train_tokenizer(default_corpus() + tokenizer_texts(world.root), vocab_size=2048)


@pytest.fixture(scope="session")
def retriever(world):
    from mopd.recipes.tiny_world.warmstart import CachedRetriever
    from mopd.retriever import open_retriever

    return CachedRetriever(open_retriever(world.index))


@pytest.fixture
def one_torch_thread():
    """Tiny models on a shared 2-core box: with two threads every small op waits for a
    descheduled thread (tens of times slower); one thread is fast and steady."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
