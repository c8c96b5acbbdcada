"""A tiny random causal LM with a word-level tokenizer, saved to a directory (TRL builds its reference
model from the path), a prompt dataset and a reward: all offline."""

from pathlib import Path

import torch

WORDS = ["a", "b", "c", "d", "e", "f", "g", "h", "one", "two", "three", "count", "say", "hello", "world"]


def tiny_causal_lm_dir(root: Path, vocab: int = 211, hidden: int = 48, layers: int = 2, seed: int = 0) -> str:
    """A random Qwen2 (untied lm head) and its tokenizer in ``root``; returns the path."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    table = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    for w in WORDS + [f"t{i}" for i in range(vocab - 3 - len(WORDS))]:
        table[w] = len(table)
    tok = Tokenizer(models.WordLevel(vocab=table, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                        unk_token="<unk>", padding_side="left")
    config = Qwen2Config(vocab_size=len(table), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, tie_word_embeddings=False, pad_token_id=0, eos_token_id=1,
                         bos_token_id=None)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = 1
    model.generation_config.pad_token_id = 0
    model.save_pretrained(root)
    tokenizer.save_pretrained(root)
    return str(root)


def grpo_dataset(n: int = 16):
    from datasets import Dataset

    prompts = ["say hello", "count one two", "a b c", "hello world"]
    return Dataset.from_dict({"prompt": [prompts[i % len(prompts)] for i in range(n)]})


def reward_len(completions, **kwargs):
    """The share of a completion's characters that are digits (the tokenizer's filler words t0..t195
    have them, its real words not): a reward with a spread over random completions, so groups have
    advantages that are not all 0."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]
