"""What a model directory is: its resolved path, a hash of its weight files and one of its chat template.

Two directories with the same name (every export is called ``export``) or one directory whose
weights were rewritten in place must not pass for the same model when a run is resumed. Hashing
whole weight files would read gigabytes, so each weight file contributes its name, its size and
sampled blocks: the first 64 KiB (a safetensors header: names, shapes, dtypes, offsets) and 16
evenly spaced 64 KiB blocks of the data (whole files below 4 MiB). Different trained weights differ
in practically every block, so the sample catches them; a change confined to bytes between the
samples is not caught (it would take a deliberate edit, not a retrained model).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

BLOCK = 64 << 10
SAMPLES = 16
WHOLE_FILE_BELOW = 4 << 20
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
INDEX_FILES = ("config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json")


def file_sample_hash(path: Path) -> str:
    """sha256 of a file's size and sampled blocks (the whole file when it is small)."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with path.open("rb") as f:
        if size <= WHOLE_FILE_BELOW:
            h.update(f.read())
        else:
            offsets = [0] + [(size - BLOCK) * i // (SAMPLES - 1) for i in range(SAMPLES)]
            for off in offsets:
                f.seek(off)
                h.update(f.read(BLOCK))
    return h.hexdigest()


def model_fingerprint(path: str | os.PathLike) -> dict:
    """``{"path": resolved path, "weights": hash, "chat_template": hash}`` of a local directory; a
    name that is not one (a Hub id) is kept as given with ``weights: None``."""
    p = Path(path).expanduser()
    if not str(path) or not p.is_dir():
        return {"path": str(path), "weights": None}
    files = sorted(f for f in p.iterdir() if f.is_file()
                   and (f.name.endswith(WEIGHT_SUFFIXES) or f.name in INDEX_FILES))
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.name}\0{file_sample_hash(f)}\n".encode())
    return {"path": str(p.resolve()), "weights": h.hexdigest()[:32] if files else None,
            "chat_template": chat_template_hash(p)}


TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def chat_template_hash(model_dir: Path) -> str | None:
    """Hash of the chat templates a tokenizer of ``model_dir`` reads: ``chat_template.jinja``,
    ``chat_template.json`` and the ``chat_template`` of ``tokenizer_config.json`` (None when it has
    none). Every prompt of a run is rendered with it: an edited template is a different policy input,
    as edited weights are."""
    h = hashlib.sha256()
    found = False
    for name in TEMPLATE_FILES:
        f = model_dir / name
        if f.is_file():
            h.update(f"{name}\0".encode() + f.read_bytes() + b"\n")
            found = True
    conf = model_dir / "tokenizer_config.json"
    if conf.is_file():
        try:
            template = json.loads(conf.read_text(encoding="utf-8")).get("chat_template")
        except (ValueError, AttributeError, UnicodeDecodeError):
            template = None               # the loader says what is wrong with the file
        if template is not None:
            h.update(b"tokenizer_config.json\0" + json.dumps(template, sort_keys=True).encode() + b"\n")
            found = True
    return h.hexdigest()[:32] if found else None


def data_fingerprint(path: str | os.PathLike) -> dict:
    """A dataset file's resolved path and sampled-content hash (``None`` when it is not a file)."""
    if not str(path):
        return {"path": "", "content": None}
    p = Path(path).expanduser()
    if not p.is_file():
        return {"path": str(path), "content": None}
    return {"path": str(p.resolve()), "content": file_sample_hash(p)[:32]}
