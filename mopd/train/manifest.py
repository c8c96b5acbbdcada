"""A checkpoint's manifest: the size and sha256 of every file, written last.

A checkpoint directory is trusted only if ``manifest.json`` exists and every file it lists is
there with the recorded size and checksum. The manifest is the last thing written (after every
rank's shards, the RNG files and ``trainer_state.json``), so a kill at any point before it leaves a
directory that fails verification, and a truncated, deleted or bit-flipped file fails it too.

Hashing reads every byte once (sha256 runs at about 1-2 GB/s per core with SHA extensions); the
files are split over the ranks, each rank hashes its share and rank 0 gathers and writes.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch.distributed as dist

from mopd.core.atomic import atomic_write_text

MANIFEST = "manifest.json"
FORMAT = 2
"""``trainer_state.json["format"]`` of checkpoints that carry a manifest (1: before manifests)."""
_CHUNK = 8 << 20


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def _listed_files(ckpt_dir: Path) -> list:
    return sorted(str(p.relative_to(ckpt_dir)) for p in ckpt_dir.rglob("*")
                  if p.is_file() and p.name != MANIFEST)


def write_manifest(ckpt_dir: str | os.PathLike) -> Path | None:
    """Hash every file of ``ckpt_dir`` (shared over the ranks) and write the manifest on rank 0.

    Every rank must call it after all files are written (it is a collective under torch.distributed).
    """
    ckpt_dir = Path(ckpt_dir)
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    names = _listed_files(ckpt_dir)
    mine: dict[str, dict] = {n: {"size": (ckpt_dir / n).stat().st_size, "sha256": file_sha256(ckpt_dir / n)}
                             for n in names[rank::world]}
    if world > 1:
        parts: list = [None] * world
        dist.all_gather_object(parts, mine)
        for p in parts:
            mine.update(p)
    if rank != 0:
        return None
    out = ckpt_dir / MANIFEST
    atomic_write_text(out, json.dumps({"format": FORMAT, "files": dict(sorted(mine.items()))}, indent=1), fsync=True)
    return out


def _malformed(files) -> str | None:
    """Why a manifest's ``files`` is not ``{name: {"size": int, "sha256": str}}``, if it is not (a
    hand-edited or damaged manifest must fail verification, never raise)."""
    if not isinstance(files, dict):
        return f"'files' is a {type(files).__name__}, not an object"
    for name, want in files.items():
        if not (isinstance(want, dict) and isinstance(want.get("size"), int) and isinstance(want.get("sha256"), str)):
            return f"the entry of {name} is not {{size, sha256}}"
        if Path(name).is_absolute() or ".." in Path(name).parts:
            return f"{name} is outside the checkpoint"
    return None


def verify_checkpoint(ckpt_dir: str | os.PathLike, required=("trainer_state.json", ".metadata"),
                      share: tuple[int, int] = (0, 1)) -> str | None:
    """``None`` if the checkpoint is complete and intact, else the reason it is not (one line).

    ``share=(rank, world)`` checksums only every world-th file from the rank-th (sizes and presence
    are checked for all): the ranks of a job split the reading, then combine their answers.
    A checkpoint whose ``trainer_state.json`` predates manifests (no ``format``) is accepted
    unverified when its required files are present."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return "not a directory"
    man = ckpt_dir / MANIFEST
    state = ckpt_dir / "trainer_state.json"
    if not man.is_file():
        try:
            fmt = json.loads(state.read_text()).get("format", 1) if state.is_file() else FORMAT
        except (ValueError, OSError):
            fmt = FORMAT
        if fmt < FORMAT:
            missing = [r for r in required if not (ckpt_dir / r).is_file()]
            return f"missing {', '.join(missing)}" if missing else None
        return "no manifest.json (the save did not finish)"
    try:
        files = json.loads(man.read_text())["files"]
    except (ValueError, KeyError, TypeError, OSError) as e:   # TypeError: the JSON is a list or a number
        return f"unreadable manifest.json ({type(e).__name__})"
    problem = _malformed(files)
    if problem:
        return f"malformed manifest.json ({problem})"
    for r in required:
        if r not in files:
            return f"the manifest does not list {r}"
    for name, want in files.items():
        p = ckpt_dir / name
        if not p.is_file():
            return f"{name} is missing"
        size = p.stat().st_size
        if size != want["size"]:
            return f"{name} has {size} bytes, the manifest says {want['size']} (truncated or rewritten)"
    rank, world = share
    for name in sorted(files)[rank::world]:   # sizes first: a truncation is found without reading anything
        if file_sha256(ckpt_dir / name) != files[name]["sha256"]:
            return f"{name} fails its sha256 check (corrupted)"
    return None
