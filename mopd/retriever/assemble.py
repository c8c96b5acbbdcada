"""Assemble Search-R1's published wiki-18 files: the index's parts into one file, the corpus out of gzip.

Search-R1 publishes its E5 flat index (``PeterJinGo/wiki-18-e5-index``) as ``part_aa``,
``part_ab``, ... (``split``'s names: to be concatenated in name order, ``cat part_* > e5_Flat.index``)
and the corpus (``PeterJinGo/wiki-18-corpus``) as ``wiki-18.jsonl.gz``. :func:`assemble` does both
and checks what ``cat`` and ``gzip -d`` do not: that no part is missing from the sequence, that
the parts' sizes add up to the written file, the checksums when a checksum file is given (hashed
while copying: no second pass over 65 GB), that the result is a FAISS index whose header faiss
reads and, for a flat index, whose size is what the header implies, and that the corpus has one
line per vector. The inputs are left in place (``gzip -d`` deletes the ``.gz``).

Outputs are written to a temporary name and renamed when complete; a record of what was written
(``mopd_assemble.json``) lets a rerun skip finished files. A file already at an output path that
this record does not describe is refused, never overwritten.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import string
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from mopd.core.atomic import atomic_open, atomic_write_json
from mopd.retriever.index_errors import IndexDirError
from mopd.retriever.index_faiss import (check_flat_size, import_faiss, mem_available, mmap_flat_flag,
                                        read_header)

RECORD = "mopd_assemble.json"
BLOCK = 16 << 20
HASHES = {32: "md5", 40: "sha1", 64: "sha256"}


@dataclass
class Assembled:
    index: Path | None = None
    corpus: Path | None = None
    vectors: int | None = None
    rows: int | None = None
    reused: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    """Files whose checksum matched the checksum file."""


def find_parts(folder: Path, prefix: str = "part_") -> list[Path]:
    """``prefix``-named parts in name order; a gap in split's suffix sequence (aa, ab, ...) is refused."""
    parts = sorted(p for p in Path(folder).glob(prefix + "*") if p.is_file() and ".tmp" not in p.name)
    if not parts:
        return []
    suffixes = [p.name[len(prefix):] for p in parts]
    width = len(suffixes[0])
    letters = string.ascii_lowercase
    if not all(len(s) == width and all(c in letters for c in s) for s in suffixes):
        # Not split's alphabetic suffixes: name order is all there is to go by.
        return parts
    index = [sum(letters.index(c) * 26 ** (width - 1 - i) for i, c in enumerate(s)) for s in suffixes]
    for want, (got, name) in enumerate(zip(index, suffixes)):
        if got != want:
            missing = "".join(letters[(want // 26 ** (width - 1 - i)) % 26] for i in range(width))
            raise IndexDirError(f"{folder}: {prefix}{missing} is missing (found {len(parts)} parts, {parts[0].name} "
                                f"to {parts[-1].name}); download every part before assembling")
    return parts


def read_checksums(path: Path) -> dict[str, str]:
    """``HASH  NAME`` lines (sha256sum / md5sum / sha1sum output; ``*NAME`` for binary mode) by file name."""
    out: dict[str, str] = {}
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        bits = line.split(None, 1)
        if len(bits) != 2 or len(bits[0]) not in HASHES or any(c not in string.hexdigits for c in bits[0]):
            raise IndexDirError(f"{path}:{n}: not a 'HASH  NAME' line (sha256sum, sha1sum or md5sum format)")
        out[Path(bits[1].strip().lstrip("*")).name] = bits[0].lower()
    if not out:
        raise IndexDirError(f"{path} holds no checksums")
    return out


def _hasher(digest: str | None):
    return hashlib.new(HASHES[len(digest)]) if digest else None


def _check(name: str, h, digest: str | None, done: list[str]) -> None:
    if h is None:
        return
    if h.hexdigest() != digest:
        raise IndexDirError(f"{name}: {h.name} {h.hexdigest()} does not match the checksum file's {digest}; "
                            "download it again")
    done.append(name)


def _free_space(folder: Path, need: int, what: str) -> None:
    free = shutil.disk_usage(folder).free
    if free < need:
        raise IndexDirError(f"{what} needs {need / 1e9:.1f} GB free in {folder}, which has {free / 1e9:.1f} GB; "
                            "free space or pass --out on another disk")


class _Record:
    """``mopd_assemble.json``: what this command wrote, so a rerun reuses it and nothing else is overwritten."""

    def __init__(self, out: Path):
        self.path = out / RECORD
        try:
            self.data = json.loads(self.path.read_text()) if self.path.is_file() else {}
        except ValueError:
            raise IndexDirError(f"{self.path} is not valid JSON; move it away to assemble again") from None

    def ours(self, dest: Path, sources: dict) -> bool:
        """Is ``dest`` this command's finished output of ``sources``?"""
        entry = self.data.get(dest.name)
        return bool(dest.is_file() and entry and entry.get("sources") == sources
                    and entry.get("size") == dest.stat().st_size)


    def add(self, dest: Path, sources: dict, **info) -> None:
        self.data[dest.name] = {"sources": sources, "size": dest.stat().st_size, **info}
        atomic_write_json(self.path, self.data)


def _refuse_existing(dest: Path) -> None:
    raise IndexDirError(f"{dest} already exists and was not written by `mopd retriever assemble` from these "
                        "files; move it away or choose another --out (nothing was overwritten)")


def _bar(total: int, desc: str, progress: bool):
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, dynamic_ncols=True,
                file=sys.stderr)


def concatenate(parts: list[Path], dest: Path, checksums: dict[str, str], checked: list[str],
                progress: bool = False) -> int:
    """``cat parts > dest`` through a temporary file, hashing each part (and the result) as it is
    copied when the checksum file names it; returns the bytes written."""
    sizes = [p.stat().st_size for p in parts]
    total = sum(sizes)
    whole = _hasher(checksums.get(dest.name))
    bar = _bar(total, f"assemble {dest.name}", progress)
    try:
        with atomic_open(dest, "wb") as f:
            for part in parts:
                h = _hasher(checksums.get(part.name))
                with open(part, "rb") as src:
                    for block in iter(lambda: src.read(BLOCK), b""):
                        f.write(block)
                        for x in (h, whole):
                            if x is not None:
                                x.update(block)
                        if bar is not None:
                            bar.update(len(block))
                _check(part.name, h, checksums.get(part.name), checked)
            written = f.tell()
            if written != total:
                raise IndexDirError(f"wrote {written} bytes to {dest} but the parts hold {total}: a part changed "
                                    "while it was copied")
            _check(dest.name, whole, checksums.get(dest.name), checked)
    finally:
        if bar is not None:
            bar.close()
    return total


def verify_index(path: Path) -> tuple[int, int]:
    """(vectors, dimension) of an assembled FAISS file; its header must be one faiss reads and, for a
    flat index, its size the one the header implies."""
    header = read_header(path)
    if header.flat:
        check_flat_size(header, path)
    faiss = import_faiss()
    if header.flat:
        flag = mmap_flat_flag(faiss)
    elif header.fourcc.startswith("Iw"):
        flag = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY     # IVF: the inverted lists are mapped
    else:
        flag = 0 if header.size < (mem_available() or 0) // 2 else None
    if flag is None:
        # Reading it whole to check it would take its size in RAM: the header, parsed, stands for it.
        return header.ntotal, header.d
    try:
        index = faiss.read_index(str(path), flag)     # faiss parses the whole structure
    except RuntimeError as e:
        raise IndexDirError(f"faiss cannot read {path}: {str(e).splitlines()[0][:300]}") from None
    return int(index.ntotal), int(index.d)


class _HashingReader:
    """A file wrapper that hashes what is read through it (the .gz bytes, for its checksum)."""

    def __init__(self, raw, h):
        self.raw, self.h = raw, h

    def read(self, n=-1):
        b = self.raw.read(n)
        self.h.update(b)
        return b


def gunzip(src: Path, dest: Path, checksums: dict[str, str], checked: list[str],
           progress: bool = False) -> int:
    """``gzip -dc src > dest`` through a temporary file (gzip's CRC and length are checked at the
    end); the .gz is kept. Returns the number of non-blank lines written (the corpus's rows)."""
    h = _hasher(checksums.get(src.name))
    out_h = _hasher(checksums.get(dest.name))
    bar = _bar(src.stat().st_size, f"gunzip {src.name}", progress)
    rows, carry, seen = 0, b"", 0
    try:
        with open(src, "rb") as raw, gzip.GzipFile(fileobj=_HashingReader(raw, h) if h else raw, mode="rb") as gz, \
                atomic_open(dest, "wb") as f:
            try:
                for block in iter(lambda: gz.read(BLOCK), b""):
                    f.write(block)
                    if out_h is not None:
                        out_h.update(block)
                    lines = (carry + block).split(b"\n")
                    carry = lines.pop()
                    rows += sum(1 for line in lines if line.strip())
                    if bar is not None:
                        bar.update(raw.tell() - seen)
                        seen = raw.tell()
            except (OSError, EOFError, zlib.error) as e:
                raise IndexDirError(f"{src} is not a complete gzip file ({e}); download it again") from None
            _check(src.name, h, checksums.get(src.name), checked)
            _check(dest.name, out_h, checksums.get(dest.name), checked)
    finally:
        if bar is not None:
            bar.close()
    return rows + bool(carry.strip())


def _gzip_size_hint(src: Path) -> int:
    """A lower bound on the decompressed size: gzip's trailer keeps it modulo 2**32."""
    with open(src, "rb") as f:
        f.seek(-4, 2)
        return max(src.stat().st_size, int.from_bytes(f.read(4), "little"))


def assemble(folder, out=None, *, index_name: str = "e5_Flat.index", prefix: str = "part_",
             corpus_gz: str | None = None, checksums: str | None = None, progress: bool = False) -> Assembled:
    """Assemble ``folder``'s index parts into ``out/index_name`` and decompress its ``*.jsonl.gz``
    corpus into ``out`` (``out`` defaults to ``folder``)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise IndexDirError(f"{folder} is not a directory (the folder holding part_aa, part_ab, ... and "
                            "wiki-18.jsonl.gz)")
    out = Path(out) if out is not None else folder
    out.mkdir(parents=True, exist_ok=True)
    sums = read_checksums(Path(checksums)) if checksums else {}
    parts = find_parts(folder, prefix)
    if corpus_gz:
        gz = folder / corpus_gz
        if not gz.is_file():
            raise IndexDirError(f"corpus {gz} does not exist")
    else:
        found = sorted(folder.glob("*.jsonl.gz"))
        if len(found) > 1:
            raise IndexDirError(f"{folder} holds {len(found)} .jsonl.gz files ({', '.join(p.name for p in found)}); "
                                "name one with --corpus-gz")
        gz = found[0] if found else None
    if not parts and gz is None:
        raise IndexDirError(f"{folder} holds no {prefix}* index parts and no .jsonl.gz corpus")
    if sums:
        known = {p.name for p in parts} | ({gz.name, gz.name[:-3]} if gz else set()) | {index_name}
        if not set(sums) & known:
            raise IndexDirError(f"{checksums} names none of {sorted(known)}")
    record = _Record(out)
    result = Assembled()
    if parts:
        dest = out / index_name
        sources = {p.name: p.stat().st_size for p in parts}
        total = sum(sources.values())
        if record.ours(dest, sources):
            result.reused.append(dest.name)
        elif dest.exists():
            # Assembled by hand (`cat part_* > e5_Flat.index`): adopted, read only, when its size
            # is the parts' and its header checks out; anything else there is the user's, refused.
            if not dest.is_file() or dest.stat().st_size != total or dest.name in sums:
                _refuse_existing(dest)
            vectors, dim = verify_index(dest)
            record.add(dest, sources, vectors=vectors, dim=dim, adopted=True)
            result.reused.append(dest.name)
        else:
            _free_space(out, total, f"assembling {dest.name}")
            concatenate(parts, dest, sums, result.checked, progress)
            try:
                vectors, dim = verify_index(dest)
            except IndexDirError:
                dest.unlink()          # ours, just written, and not an index: a rerun must not reuse it
                raise
            record.add(dest, sources, vectors=vectors, dim=dim)
        result.index = dest
        result.vectors = record.data[dest.name].get("vectors")
    if gz is not None:
        dest = out / gz.name[:-3]
        sources = {gz.name: gz.stat().st_size}
        if record.ours(dest, sources):
            result.reused.append(dest.name)
        else:
            if dest.exists():
                _refuse_existing(dest)
            _free_space(out, _gzip_size_hint(gz), f"decompressing {gz.name}")
            rows = gunzip(gz, dest, sums, result.checked, progress)
            record.add(dest, sources, rows=rows)
        result.corpus = dest
        result.rows = record.data[dest.name].get("rows")
    if result.vectors is not None and result.rows is not None and result.vectors != result.rows:
        raise IndexDirError(f"{result.index} holds {result.vectors:,} vectors but {result.corpus} has "
                            f"{result.rows:,} lines: they are not from the same build (row i of the index is "
                            "line i of the corpus)")
    return result
