"""A randomly initialised small Qwen3 model with its own byte-level BPE tokenizer, built offline:
the model the tests and benches train and sample, and what a recipe's world may start its base
model from (warm-started on its own demonstrations).

It has the same architecture, chat format and special tokens as Qwen3, but is small enough to
sample and train on a laptop CPU in seconds. The tokenizer is trained on the role prompts plus the
caller's texts (a world's passages and demonstrations), so the model's vocabulary fits the text it
will see; the action tags are single added tokens. Deterministic for a seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, List, Optional
from mopd.rollout.prompts import all_prompt_texts

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""Qwen's ChatML layout, without Qwen's default system message or tool handling."""

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TAG_TOKENS = ["<think>", "</think>", "<search>", "</search>", "<information>", "</information>",
              "<report>", "</report>", "<subtask>", "</subtask>", "<select>", "</select>",
              "<answer>", "</answer>"]

_BUILTIN_TEXT = """\
Question: Where was the band formed? Which river flows through the town? Who wrote the song?
When was the city founded? What is the capital of the country? How many members did the group have?
The band was formed in the town in 1998 by two brothers and a friend from school.
The river flows through the town and the valley before it reaches the sea in the north.
Doc 1(Title: The town) The town lies on the river. Doc 2(Title: The band) The band was formed there.
Report 1: The band was formed in the town. Report 2: The river flows through it.
<think>I need to find where the band was formed first, then the river.</think>
<search>band formed town</search> <report>The band was formed in the town.</report>
<subtask>Find where the band was formed.</subtask> <select>1,2</select> <answer>the river</answer>
0 1 2 3 4 5 6 7 8 9 10 100 1000 1990 2000 2010 2020 January February March April May June July
August September October November December north south east west old new first second third
"""


def default_corpus() -> List[str]:

    return list(all_prompt_texts()) + _BUILTIN_TEXT.splitlines()


def train_tokenizer(texts: Iterable[str], vocab_size: int = 1024):
    """A byte-level BPE ``PreTrainedTokenizerFast`` with Qwen's special tokens and the tags as
    single added tokens, and the ChatML chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(texts), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   unk_token=None, bos_token=None, clean_up_tokenization_spaces=False)
    fast.chat_template = CHAT_TEMPLATE
    return fast


@dataclass(frozen=True)
class RandomModelSpec:
    """Shape and seed of a small random Qwen3 model."""

    vocab_size: int = 1024
    """Byte-level BPE vocabulary (the chat and tag tokens come on top)."""
    hidden: int = 128
    """Hidden size (a multiple of ``heads``)."""
    layers: int = 2
    """Decoder layers."""
    heads: int = 4
    """Attention heads."""
    ffn: int = 384
    """SwiGLU intermediate size."""
    kv_heads: Optional[int] = None
    """Key/value heads (default: ``heads``)."""
    max_positions: int = 16384
    """Longest sequence the rotary tables cover."""
    seed: int = 0
    """Seed of the initial weights."""

    def __post_init__(self):
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} must be a multiple of heads={self.heads}")


def init_random_model(out_dir, corpus_texts: Optional[Iterable[str]] = None, **spec) -> Path:
    """Write a random Qwen3 model (tied embeddings, float32) and its tokenizer to ``out_dir``;
    ``spec`` are :class:`RandomModelSpec` fields (vocab_size, hidden, layers, heads, ffn, kv_heads,
    max_positions, seed).

    ``corpus_texts`` (default: the role prompts and a little built-in text) trains the tokenizer;
    the prompts are always included so role prompts tokenise compactly. Deterministic for a seed.
    """
    s = RandomModelSpec(**spec)
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    texts = default_corpus() + (list(corpus_texts) if corpus_texts is not None else [])
    tokenizer = train_tokenizer(texts, vocab_size=s.vocab_size)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=s.hidden, intermediate_size=s.ffn, num_hidden_layers=s.layers,
        num_attention_heads=s.heads, num_key_value_heads=s.kv_heads or s.heads, head_dim=s.hidden // s.heads,
        max_position_embeddings=s.max_positions, tie_word_embeddings=True, eos_token_id=eos,
        pad_token_id=pad, bos_token_id=None, rms_norm_eps=1e-6,
    )
    torch.manual_seed(s.seed)
    model = Qwen3ForCausalLM(config).to(torch.float32)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
