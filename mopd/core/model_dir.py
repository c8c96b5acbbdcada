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
import os
from pathlib import Path
from typing import Optional

TOKENIZER_FILES = (("tokenizer.json",), ("tokenizer.model",), ("vocab.json", "merges.txt"), ("vocab.txt",))
"""Any one of these sets makes a loadable tokenizer (fast JSON, SentencePiece, BPE, WordPiece)."""

RUN_DIR_HINT = "this is a run directory; export it with `mopd export RUN --out DIR`"

TRUST_ENV = "MOPD_TRUST_REMOTE_CODE"
"""Set to 1 by a command whose config has ``model.trust_remote_code=true`` (inherited by its
workers and stage processes); every ``from_pretrained`` of ours passes what it says, so
transformers never asks on a terminal and never runs a model directory's code otherwise."""


def trust_remote_code(trusted: bool) -> None:
    """Record this command's choice (``model.trust_remote_code``) for the loaders of this process
    and the processes it starts."""
    os.environ[TRUST_ENV] = "1" if trusted else "0"


def remote_code_trusted() -> bool:
    """The ``trust_remote_code`` argument of every ``from_pretrained`` call (False unless opted in)."""
    return os.environ.get(TRUST_ENV) == "1"


def remote_code(path: str | Path) -> str | None:
    """What Python code of its own the model directory ``path`` needs to load (``auto_map`` in
    config.json or tokenizer_config.json, or a config.json without ``model_type`` that names code),
    or None."""
    p = Path(path)
    needs = []
    for name in ("config.json", "tokenizer_config.json"):
        try:
            data = json.loads((p / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        auto_map = data.get("auto_map") if isinstance(data, dict) else None
        if auto_map:
            classes = ", ".join(sorted(auto_map)) if isinstance(auto_map, dict) else str(auto_map)[:60]
            needs.append(f"{name}'s auto_map: {classes}")
    return "; ".join(needs) or None


def remote_code_problem(path: str | Path, trusted: bool | None = None) -> str | None:
    """Why ``path`` is refused for needing its own code (the end of a sentence that starts with
    the path), unless ``trusted`` (default: :func:`remote_code_trusted`)."""
    trusted = remote_code_trusted() if trusted is None else trusted
    needs = None if trusted else remote_code(path)
    if needs is None:
        return None
    return (f"needs Python code from the model directory to load ({needs}); mopd does not run it unless "
            "model.trust_remote_code=true is set (`mopd export --trust-remote-code`), which runs that code in "
            "this process")


def is_run_directory(path: Path) -> bool:
    """A training run directory (``run.json`` or ``checkpoints/``), not a model."""
    return (path / "run.json").is_file() or (path / "checkpoints").is_dir()


def model_dir_problem(path: str | Path, trusted: bool | None = None) -> str | None:
    """``None`` if ``path`` (an existing local directory) holds a causal LM with a tokenizer,
    else why not, as the end of a sentence that starts with the path. A directory that needs its
    own code is refused unless ``trusted`` (default: :func:`remote_code_trusted`)."""
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
    problem = remote_code_problem(p, trusted) or _architecture_problem(config)
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


def hub_snapshot(name: str) -> Optional[Path]:
    """The Hugging Face cache's snapshot of hub id ``name`` (its ``main`` revision, else the newest
    one holding a config.json); None when it is not there. Never the network. The cache is
    ``HF_HUB_CACHE``, else ``HF_HOME/hub``, read at each call."""
    parts = name.split("/")
    if len(parts) != 2 or not all(parts):
        return None
    hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub")
    repo = hub.expanduser() / f"models--{name.replace('/', '--')}"
    ref = repo / "refs" / "main"
    if ref.is_file() and (repo / "snapshots" / ref.read_text().strip() / "config.json").is_file():
        return repo / "snapshots" / ref.read_text().strip()
    found = sorted((repo / "snapshots").glob("*/config.json"), key=lambda f: f.stat().st_mtime) \
        if (repo / "snapshots").is_dir() else []
    return found[-1].parent if found else None
