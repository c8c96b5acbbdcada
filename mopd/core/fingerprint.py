"""What a model directory is: its resolved path and a hash of its weight files.

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
    """``{"path": resolved path, "weights": hash}``; a name that is not a local directory (a Hub id)
    is kept as given with ``weights: None``."""
    p = Path(path).expanduser()
    if not str(path) or not p.is_dir():
        return {"path": str(path), "weights": None}
    files = sorted(f for f in p.iterdir() if f.is_file()
                   and (f.name.endswith(WEIGHT_SUFFIXES) or f.name in INDEX_FILES))
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.name}\0{file_sample_hash(f)}\n".encode())
    return {"path": str(p.resolve()), "weights": h.hexdigest()[:32] if files else None}


def data_fingerprint(path: str | os.PathLike) -> dict:
    """A dataset file's resolved path and sampled-content hash (``None`` when it is not a file)."""
    if not str(path):
        return {"path": "", "content": None}
    p = Path(path).expanduser()
    if not p.is_file():
        return {"path": str(path), "content": None}
    return {"path": str(p.resolve()), "content": file_sample_hash(p)[:32]}
