"""A FlashRAG / Search-R1 jsonl corpus read by row, with the text kept on disk.

Memory plan: wiki-18 is 21M lines (about 14 GB of text); holding it as Python objects would take
several times that. We keep the text once, in the jsonl file itself, and build on first use a
row-offset table (one int64 per non-empty line: 170 MB for wiki-18), saved as ``.npy`` and
memory-mapped (it is written whole under a new name, never rewritten in place). Fetching row ``i``
is one ``pread`` of its bytes plus one ``json.loads``; the page cache holds the hot rows.

The jsonl is read, not memory-mapped: a file rewritten in place under a mapping turns the next read
of a page past its new end into SIGBUS, which kills the process without a word (a server, or a
training run and its last steps). After each read the file's size, modification time and inode
are compared with those it had when opened: a change is :class:`CorpusChanged` (one line), unless
the file's fingerprint is still the one it had (the same rows written again, e.g. by a sync), in
which case reading goes on. A corpus replaced by a rename is not a change here: the open file is
still the old one, whose rows are the index's.

Rows are ``{"id", "contents": "title\\ntext"}`` (rows with ``title`` and ``text`` fields instead
of ``contents`` are accepted too). Row numbers follow line order, skipping blank lines, which is
how FlashRAG and Search-R1 number the vectors of their FAISS indexes.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from mopd.core.atomic import atomic_open
from mopd.core.errors import UserError
from mopd.retriever.client import RetrieverUnavailable
from mopd.retriever.passage import Passage

_SCAN_BLOCK = 64 << 20  # bytes per newline-scan step while building the offset table


class CorpusError(UserError, ValueError):
    """A missing, empty or malformed corpus file; the message names the file and the row."""


class CorpusChanged(CorpusError, RetrieverUnavailable):
    """The corpus file was rewritten while it was being read: its rows may no longer be the index's.

    Also a :class:`RetrieverUnavailable`: a training run stops on it as on a retriever that is down
    (one line, a checkpoint of its last finished step)."""


def default_cache_dir() -> Path:
    """Where derived files (offset tables, the bundled index) go: $MOPD_CACHE or ~/.cache/mopd."""
    return Path(os.environ.get("MOPD_CACHE") or Path.home() / ".cache" / "mopd")


def corpus_fingerprint(path: str | os.PathLike, block: int = 1 << 16, samples: int = 32) -> str:
    """A content hash of a corpus file that costs a few milliseconds even for 14 GB.

    Files up to ``2 * block * samples`` bytes (4 MiB) are hashed whole; larger ones by their size and
    ``samples`` evenly spaced blocks (first and last included). Any edit that changes the size, the
    row count or a sampled block changes the fingerprint; it is a guard against using an index with
    the wrong corpus, not a cryptographic seal."""
    size = os.path.getsize(path)
    h = hashlib.sha256(f"size={size};".encode())
    with open(path, "rb") as f:
        if size <= 2 * block * samples:
            h.update(f.read())
        else:
            for j in range(samples):
                f.seek((size - block) * j // (samples - 1))
                h.update(f.read(block))
    return h.hexdigest()[:32]


def line_starts(path: str | os.PathLike, block: int = _SCAN_BLOCK) -> np.ndarray:
    """Byte offsets of the non-blank lines of a file, scanning it in ``block``-byte steps."""
    size = os.path.getsize(path)
    starts: list[np.ndarray] = []
    with open(path, "rb") as f:
        pos = 0
        while pos < size:
            buf = np.frombuffer(f.read(block), dtype=np.uint8)
            nl = np.flatnonzero(buf == 10) + pos
            starts.append(nl + 1)
            pos += len(buf)
    begins = np.concatenate([np.zeros(1, np.int64)] + [s.astype(np.int64) for s in starts])
    ends = np.concatenate([begins[1:] - 1, [size]])  # exclusive end of each line, before its \n
    begins, ends = begins[begins < size], ends[begins < size]
    # A line is blank when it holds nothing but whitespace; check only the short ones.
    keep = np.ones(len(begins), bool)
    short = np.flatnonzero(ends - begins <= 4)
    if len(short):
        with open(path, "rb") as f:
            for i in short:
                keep[i] = bool(os.pread(f.fileno(), int(ends[i] - begins[i]), int(begins[i])).strip())
    return begins[keep]


class Corpus:
    """Rows of a jsonl corpus, fetched by row number from a memory map."""

    def __init__(self, path: str | os.PathLike, cache_dir: str | os.PathLike | None = None):
        self.path = Path(path)
        if not self.path.is_file():
            raise CorpusError(f"corpus file {self.path} does not exist")
        if self.path.suffix == ".gz":
            raise CorpusError(f"corpus {self.path} is gzip-compressed; decompress it first (gzip -dk {self.path})")
        if self.path.stat().st_size == 0:
            raise CorpusError(f"corpus file {self.path} is empty")
        self.fingerprint = corpus_fingerprint(self.path)
        self.offsets_path = self._offsets_path(cache_dir)
        if self.offsets_path.is_file():
            self._starts = np.load(self.offsets_path, mmap_mode="r")
        else:
            starts = line_starts(self.path)
            self.offsets_path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_open(self.offsets_path, "wb") as f:   # concurrent builders each write their own
                np.save(f, starts)
            self._starts = np.load(self.offsets_path, mmap_mode="r")
        if len(self._starts) == 0:
            raise CorpusError(f"corpus file {self.path} has no rows")
        self._file = open(self.path, "rb")
        self._stat = self._identity(os.fstat(self._file.fileno()))
        self._check_lock = threading.Lock()
        self.document(0)  # fail early on a file that is not a corpus

    def _offsets_path(self, cache_dir) -> Path:
        name = f"{self.path.stem}.{self.fingerprint[:16]}.offsets.npy"
        return Path(cache_dir or default_cache_dir() / "corpus") / name

    def __len__(self) -> int:
        return len(self._starts)

    def close(self) -> None:
        self._file.close()

    @staticmethod
    def _identity(st: os.stat_result) -> tuple[int, int, int]:
        return st.st_ino, st.st_size, st.st_mtime_ns

    def check_unchanged(self) -> bool:
        """Raise :class:`CorpusChanged` if the open file was modified since it was opened (see the
        module docstring). The same rows written again (same size and fingerprint) are accepted:
        then True (what was read during the rewrite is read again), else False."""
        now = self._identity(os.fstat(self._file.fileno()))
        if now == self._stat:
            return False
        with self._check_lock:
            if now == self._stat:
                return True
            old_size, size = self._stat[1], now[1]
            if size == old_size and corpus_fingerprint(self.path) == self.fingerprint \
                    and self._identity(os.fstat(self._file.fileno())) == now:
                self._stat = now          # rewritten with the same rows: read on
                return True
            raise CorpusChanged(f"corpus {self.path} was modified while in use ({old_size:,} -> {size:,} bytes): "
                                "its rows may no longer be the index's; restore the corpus the index was built "
                                "from and restart, or rebuild the index")

    def raw_line(self, row: int) -> bytes:
        if not 0 <= row < len(self._starts):
            raise IndexError(f"row {row} is outside corpus {self.path} ({len(self)} rows)")
        start = int(self._starts[row])
        stop = int(self._starts[row + 1]) if row + 1 < len(self._starts) else self._stat[1]
        data = os.pread(self._file.fileno(), max(stop - start, 0), start)
        if self.check_unchanged():     # after the read: what was read came from the file as opened
            data = os.pread(self._file.fileno(), max(stop - start, 0), start)
        end = data.find(b"\n")
        return data[:end] if end >= 0 else data

    def document(self, row: int) -> dict:
        """Row ``row`` as a Search-R1 document ``{"id": str, "contents": "title\\ntext"}``."""
        line = self.raw_line(row)
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise CorpusError(f"{self.path} row {row}: not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise CorpusError(f"{self.path} row {row}: expected a JSON object")
        contents = obj.get("contents")
        if contents is None and "text" in obj:
            contents = f"{obj.get('title', '')}\n{obj['text']}"
        if not isinstance(contents, str):
            raise CorpusError(f"{self.path} row {row}: needs a string field 'contents' (\"title\\ntext\")")
        return {"id": str(obj.get("id", row)), "contents": contents}

    def passage(self, row: int, score: float = 0.0) -> Passage:
        d = self.document(row)
        return Passage.from_contents(d["id"], d["contents"], score)

    def contents(self, rows: Sequence[int]) -> list[str]:
        return [self.document(int(r))["contents"] for r in rows]

    def iter_contents(self, start: int = 0, stop: int | None = None) -> Iterator[str]:
        for r in range(start, len(self) if stop is None else min(stop, len(self))):
            yield self.document(r)["contents"]
