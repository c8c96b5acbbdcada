"""Is a local directory a model that training and evaluation can load? One line saying why not.

Loading a model takes minutes and transformers' own failures are tracebacks that name neither
the directory nor the fix: an empty tokenizer (no tokenizer files) fails only at the first
rollout, a ``tokenizer_config.json`` without ``tokenizer.json`` raises "Couldn't instantiate the
backend tokenizer", an unknown ``model_type`` raises from the auto classes, and a training run
directory (checkpoints, not a model) looks like any of them. These checks read only file names
and ``config.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

TOKENIZER_FILES = (("tokenizer.json",), ("tokenizer.model",), ("vocab.json", "merges.txt"), ("vocab.txt",))
"""Any one of these sets makes a loadable tokenizer (fast JSON, SentencePiece, BPE, WordPiece)."""

RUN_DIR_HINT = "this is a run directory; export it with `mopd export RUN --out DIR`"


def is_run_directory(path: Path) -> bool:
    """A training run directory (``run.json`` or ``checkpoints/``), not a model."""
    return (path / "run.json").is_file() or (path / "checkpoints").is_dir()


def model_dir_problem(path: str | Path) -> str | None:
    """``None`` if ``path`` (an existing local directory) holds a causal LM with a tokenizer,
    else why not, as the end of a sentence that starts with the path."""
    p = Path(path)
    if is_run_directory(p):
        return RUN_DIR_HINT
    conf = p / "config.json"
    if not conf.is_file():
        return "is not a model directory (no config.json)"
    try:
        config = json.loads(conf.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        return f"has a config.json that is not valid JSON ({e})"
    if not isinstance(config, dict):
        return "has a config.json that is not a JSON object"
    problem = _architecture_problem(config)
    if problem:
        return problem
    if not any(all((p / f).is_file() for f in files) for files in TOKENIZER_FILES):
        return ("has no usable tokenizer (needs tokenizer.json, tokenizer.model, or vocab.json with merges.txt); "
                "copy the tokenizer files of its base model into it")
    return None


def _architecture_problem(config: dict) -> str | None:
    """A ``model_type`` that transformers can build as a causal LM (or remote code that names one)."""
    if "AutoModelForCausalLM" in (config.get("auto_map") or {}):
        return None
    model_type = config.get("model_type")
    if not model_type:
        return "has no model_type in config.json"
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return (f"has model_type {model_type!r}, which transformers {transformers.__version__} cannot load as a "
                "causal language model")
    return None
