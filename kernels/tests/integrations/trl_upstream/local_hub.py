"""The hub ids TRL's GRPOTrainer tests load, built locally (random weights, a word-level tokenizer with
a chat template) into a Hugging Face cache laid out as the hub's (``models--org--name/snapshots``),
so ``from_pretrained("trl-internal-testing/...")`` resolves offline; and the ``zen`` prompt datasets.

Each id serves a tiny Llama of the class it names (causal LM or sequence classifier): transformers 5
loads a ``qwen2`` config's tokenizer as Qwen2's byte-level BPE whatever the tokenizer files say,
which a word-level tokenizer built offline cannot be; Llama's trusts the files."""

from __future__ import annotations

import json
from pathlib import Path

ZEN = ["Beautiful is better than", "Explicit is", "Simple is better", "Complex", "Flat is better than",
       "Sparse is better", "Readability", "Special cases aren't special", "Although practicality beats",
       "Errors should never", "Unless explicitly", "In the face of ambiguity, refuse", "There should be one",
       "Although that way may not be obvious at first unless you're", "Now is better than",
       "Although never is often better than", "If the implementation is hard to explain, it's a"]
"""The prompts of the zen dataset's train split (the first twelve as TRL's test of the generation batches
spells them out)."""
ZEN_TEST = ["If the implementation is easy to explain, it may be a", "Namespaces are one"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")
SNAPSHOT = "0" * 40
VOCAB, PAD, EOS = 512, 509, 511
"""A small vocabulary, pad and eos at its end as Qwen2.5's are. (Qwen2.5's own size, 151,936, with pad
151643 and eos 151645, lets the two mask_truncated_completions tests pass -- they write those ids into
completions and count on a random model almost never sampling eos -- but made the whole file take
over 40 minutes on a loaded 2-core box, past CI's budget; conftest.NOT_RUN lists the two.)"""


def _tokenizer(vocab: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    table = {"<unk>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    words = sorted({w for line in ZEN + ZEN_TEST for w in line.split()} | {"user", "assistant", "system"})
    for w in words:
        table.setdefault(w, len(table))
    filler = 0
    while len(table) < vocab:
        token_id = len(table)
        table[{PAD: "<pad>", EOS: "<eos>"}.get(token_id, f"t{filler}")] = token_id
        filler += 1
    tok = Tokenizer(models.WordLevel(vocab=table, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                        additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _save(cache: Path, repo_id: str, model, tokenizer) -> None:
    org, name = repo_id.split("/")
    root = cache / f"models--{org}--{name}"
    snap = root / "snapshots" / SNAPSHOT
    snap.mkdir(parents=True, exist_ok=True)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(SNAPSHOT)
    model.save_pretrained(snap)
    tokenizer.save_pretrained(snap)
    # a word-level tokenizer: without this, AutoTokenizer would load the model type's own (Qwen2's BPE)
    config_file = snap / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_file.write_text(json.dumps(config))


def build_hub(cache: Path, vocab: int = VOCAB, hidden: int = 16) -> None:
    """Every text model the vendored tests load, in ``cache`` (the hub's layout)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

    tokenizer = _tokenizer(vocab)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, pad_token_id=PAD,
                  eos_token_id=EOS, bos_token_id=None)
    torch.manual_seed(0)
    lm = LlamaForCausalLM(LlamaConfig(tie_word_embeddings=False, **common))
    lm.generation_config.eos_token_id, lm.generation_config.pad_token_id = EOS, PAD
    _save(cache, "trl-internal-testing/tiny-Qwen2ForCausalLM-2.5", lm, tokenizer)
    for repo in ("tiny-Qwen2ForSequenceClassification-2.5", "tiny-Qwen3ForSequenceClassification",
                 "tiny-LlamaForSequenceClassification-3.2"):
        model = LlamaForSequenceClassification(LlamaConfig(num_labels=1, **common))
        _save(cache, f"trl-internal-testing/{repo}", model, tokenizer)


def zen_dataset(config_name: str, split: str | None = None):
    """TRL's ``trl-internal-testing/zen`` prompt-only configs: a DatasetDict, or one split."""
    from datasets import Dataset, DatasetDict

    def rows(lines):
        if config_name == "standard_prompt_only":
            return {"prompt": lines}
        if config_name == "conversational_prompt_only":
            return {"prompt": [[{"role": "user", "content": line}] for line in lines]}
        raise ValueError(f"zen config {config_name!r} is not built locally")

    data = DatasetDict(train=Dataset.from_dict(rows(ZEN)), test=Dataset.from_dict(rows(ZEN_TEST)))
    return data if split is None else data[split]
