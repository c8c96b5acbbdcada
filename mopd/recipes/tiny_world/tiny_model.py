"""The tiny world's model: the core's random Qwen3 model (:mod:`mopd.rollout.random_model`), under
the names the recipe has always used (``mopd model init-tiny``, pi_0's warm start)."""

from mopd.rollout.random_model import CHAT_TEMPLATE, SPECIAL_TOKENS, TAG_TOKENS, default_corpus, train_tokenizer
from mopd.rollout.random_model import RandomModelSpec as TinyModelSpec
from mopd.rollout.random_model import init_random_model as init_tiny_model

__all__ = ["CHAT_TEMPLATE", "SPECIAL_TOKENS", "TAG_TOKENS", "TinyModelSpec", "default_corpus", "init_tiny_model",
           "train_tokenizer"]
