"""The core tests' small model: the core's random Qwen3 model (:mod:`mopd.rollout.random_model`),
under the names the tests use; no recipe involved."""

from mopd.rollout.random_model import CHAT_TEMPLATE, default_corpus, train_tokenizer
from mopd.rollout.random_model import RandomModelSpec as TinyModelSpec
from mopd.rollout.random_model import init_random_model as init_tiny_model

__all__ = ["CHAT_TEMPLATE", "TinyModelSpec", "default_corpus", "init_tiny_model", "train_tokenizer"]
