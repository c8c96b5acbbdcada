"""What a LoRA adapter directory is and what base model it needs (no torch, no PEFT import).

An adapter directory is PEFT's format: ``adapter_config.json`` (rank, alpha, target modules, the
base's name) and ``adapter_model.safetensors`` (tensors named ``base_model.model.<module>.lora_A.weight``),
which ``PeftModel.from_pretrained`` and vLLM's LoRA loader read. ``mopd export --adapter`` adds
``mopd_base.json``: the base's path and the fingerprint of its weights
(:func:`mopd.core.fingerprint.model_fingerprint`), so that a teacher, an evaluation or a resume on
another base is refused in one line instead of scoring garbage.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
BASE_FILE = "mopd_base.json"
PEFT_PREFIX = "base_model.model."
"""The prefix of every tensor name in PEFT's adapter files (the PeftModel's own module path)."""


class AdapterDirError(ValueError):
    """A directory meant as an adapter cannot be used (the message names the file and why)."""


@dataclass(frozen=True)
class AdapterDir:
    path: str
    config: dict
    """``adapter_config.json`` as written by PEFT."""
    base_path: str
    """The base model's directory: ``mopd_base.json``'s, else PEFT's ``base_model_name_or_path``."""
    base_weights: Optional[str]
    """The base's weights fingerprint (``mopd_base.json``), None for an adapter PEFT wrote alone."""

    @property
    def rank(self) -> int:
        return int(self.config.get("r", 0))

    @property
    def base_dir(self) -> str:
        """The base as a loadable local directory where there is one (a Hub id: its snapshot in the
        local Hugging Face cache), else ``base_path`` as recorded."""
        return str(resolve_base_dir(self.base_path) or self.base_path)


FULL_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
"""The weight files of a full model: a directory with one of them is a model, not an adapter."""


def is_adapter_dir(path: str) -> bool:
    """Whether ``path`` is a directory holding an adapter (``adapter_config.json``) and no full
    model's weights (a base's ``config.json`` copied beside an adapter does not make it a model)."""
    if not path:
        return False
    p = Path(path).expanduser()
    return p.is_dir() and (p / ADAPTER_CONFIG).is_file() and not any((p / f).is_file() for f in FULL_WEIGHTS)


def resolve_base_dir(path: str) -> Optional[Path]:
    """The local directory of a model named by ``path``: the directory itself, or a Hub id's
    snapshot in the local Hugging Face cache (nothing is downloaded); None where there is none."""
    if not path:
        return None
    p = Path(path).expanduser()
    if p.is_dir():
        return p.resolve()
    if path.startswith((".", "~", "/")):
        return None
    from mopd.core.model_dir import hub_snapshot

    return hub_snapshot(path)


def read_adapter_dir(path: str) -> AdapterDir:
    """The adapter at ``path`` and the base it needs; one line (AdapterDirError) for what is missing
    or malformed."""
    p = Path(path).expanduser()
    conf_file = p / ADAPTER_CONFIG
    try:
        config = json.loads(conf_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise AdapterDirError(f"{conf_file} cannot be read ({type(e).__name__}: {str(e)[:80]})") from None
    if not isinstance(config, dict) or str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise AdapterDirError(f"{conf_file} is not a LoRA adapter's config (peft_type "
                              f"{config.get('peft_type') if isinstance(config, dict) else type(config).__name__})")
    if not isinstance(config.get("r"), int) or config["r"] <= 0:
        raise AdapterDirError(f"{conf_file} has no positive rank r")
    if not (p / ADAPTER_WEIGHTS).is_file():
        raise AdapterDirError(f"{p} has no {ADAPTER_WEIGHTS}")
    base = {}
    if (p / BASE_FILE).is_file():
        try:
            base = json.loads((p / BASE_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise AdapterDirError(f"{p / BASE_FILE} cannot be read ({type(e).__name__})") from None
        if not isinstance(base, dict):
            raise AdapterDirError(f"{p / BASE_FILE} is not a JSON object")
    base_path = str(base.get("path") or config.get("base_model_name_or_path") or "")
    if not base_path:
        raise AdapterDirError(f"{p} does not say which base model it adapts (no {BASE_FILE}, no "
                              "base_model_name_or_path in its config)")
    weights = base.get("weights")
    return AdapterDir(str(p), config, base_path, weights if isinstance(weights, str) else None)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def tokenizer_dir(model_path: str) -> str:
    """Where the tokenizer of ``model_path`` is: the directory itself, or, for an adapter directory
    without tokenizer files of its own (``mopd export --adapter`` writes none), its base's."""
    if not is_adapter_dir(model_path) or any((Path(model_path) / f).is_file() for f in TOKENIZER_FILES):
        return model_path
    return read_adapter_dir(model_path).base_dir


def adapter_of(model_path: str) -> Optional[AdapterDir]:
    """The adapter in ``model_path`` when it is an adapter directory (None for a full model), after
    checking the base it names: a local model directory whose weights are those the adapter was
    trained over (compared by fingerprint, as a resume does; an adapter PEFT wrote alone carries none
    and is taken at its word). One line (AdapterDirError) otherwise."""
    if not is_adapter_dir(model_path):
        return None
    from mopd.core.fingerprint import model_fingerprint

    adapter = read_adapter_dir(model_path)
    base = Path(adapter.base_dir).expanduser()
    if not (base / "config.json").is_file():
        raise AdapterDirError(f"{model_path} is an adapter over {adapter.base_path}, which is not a model directory "
                              "here: put the base model there (or edit mopd_base.json), or evaluate a merged export "
                              "(`mopd export RUN` without --adapter)")
    check_adapter_files(adapter)
    have = model_fingerprint(base)["weights"]
    if adapter.base_weights and have and have != adapter.base_weights:
        raise AdapterDirError(f"{model_path} is an adapter over another base model (weights "
                              f"{adapter.base_weights[:12]}; {adapter.base_path} has {have[:12]}): give it the base "
                              "it was trained on, or evaluate a merged export")
    return adapter


def check_adapter_files(adapter: AdapterDir) -> None:
    """The adapter's tensors read (a cut file is one line) and fit its config: every ``lora_A`` has
    ``r`` rows and every ``lora_B`` ``r`` columns (AdapterDirError naming the file otherwise)."""
    f = Path(adapter.path) / ADAPTER_WEIGHTS
    shapes = safetensors_shapes(f)
    r = adapter.rank
    bad = [(k, s) for k, s in shapes.items()
           if (".lora_A." in k and (len(s) != 2 or s[0] != r)) or (".lora_B." in k and (len(s) != 2 or s[1] != r))]
    if bad:
        k, s = bad[0]
        raise AdapterDirError(f"{f}: tensor {k} has shape {list(s)}, which does not fit rank r={r} of its "
                              f"{Path(adapter.path) / ADAPTER_CONFIG} ({len(bad)} such tensors)")
    if not any(".lora_A." in k for k in shapes):
        raise AdapterDirError(f"{f} holds no LoRA tensor (lora_A/lora_B)")


def safetensors_shapes(f: Path) -> Dict[str, Tuple[int, ...]]:
    """The tensor shapes in a safetensors file's header, read by safetensors itself, which also
    checks the file holds all the data its header announces (AdapterDirError naming the file
    otherwise: a cut or damaged file)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(f), framework="numpy") as g:
            return {k: tuple(g.get_slice(k).get_shape()) for k in g.keys()}
    except (OSError, SafetensorError) as e:
        raise AdapterDirError(f"{f} cannot be read ({str(e).strip().splitlines()[0] if str(e).strip() else e!r}): "
                              "it is cut or damaged; write the adapter again") from None