"""A tiny random causal LM with a word-level tokenizer, saved to a directory (TRL builds its reference
model from the path), a prompt dataset and a reward: all offline."""

from pathlib import Path

import torch

WORDS = ["a", "b", "c", "d", "e", "f", "g", "h", "one", "two", "three", "count", "say", "hello", "world"]


ARCHS = {
    # model class and config class in transformers, and what sets each apart from the Qwen2 default
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", {}),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", dict(final_logit_softcapping=1.5, head_dim=12)),  # a tight cap
    "cohere": ("CohereForCausalLM", "CohereConfig", dict(logit_scale=2.5)),
    "qwen3_moe": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", dict(num_experts=4, num_experts_per_tok=2,
                                                                  moe_intermediate_size=24, output_router_logits=True,
                                                                  router_aux_loss_coef=0.05, head_dim=12)),
}
"""The tiny architectures the integration tests train: Qwen2's plain head, Gemma 2's soft-capped one,
Cohere's scaled one, and a Mixture-of-Experts model whose forward returns router logits."""


def tiny_causal_lm_dir(root: Path, vocab: int = 211, hidden: int = 48, layers: int = 2, seed: int = 0,
                       arch: str = "qwen2") -> str:
    """A random model of ``arch`` (``ARCHS``; untied lm head) and its tokenizer in ``root``; returns the path."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    table = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    for w in WORDS + [f"t{i}" for i in range(vocab - 3 - len(WORDS))]:
        table[w] = len(table)
    tok = Tokenizer(models.WordLevel(vocab=table, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                        unk_token="<unk>", padding_side="left")
    model_class, config_class, extra = ARCHS[arch]
    config = getattr(transformers, config_class)(
        vocab_size=len(table), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
        pad_token_id=0, eos_token_id=1, bos_token_id=None, **extra)
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config)
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
