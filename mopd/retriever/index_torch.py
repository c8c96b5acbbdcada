"""Exact inner-product search with plain torch: ``q @ X^T`` and top-k in row chunks.

Memory plan: the database X [N, D] stays where it is (a memory-mapped ``vectors.npy`` on CPU, or
one fp16 copy on the GPU: 21M x 768 x 2 B = 32 GB for wiki-18 with E5, fits one H200). Scores are
formed for ``chunk_rows`` database rows at a time (a [n_queries, chunk_rows] block), reduced to
each chunk's top-k and merged with the running top-k, so extra memory is O(n_queries * chunk_rows)
whatever N is. Exact, like FAISS flat, and needs no faiss-gpu.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mopd.retriever.index_faiss import INDEX_FILE, flat_vectors

VECTORS_FILE = "vectors.npy"


def chunked_topk(queries, database, k: int, chunk_rows: int = 65536):
    """Top-``k`` rows of ``database`` [N, D] by inner product with each of ``queries`` [Q, D].

    Returns (scores [Q, k'], ids [Q, k']) with k' = min(k, N), best first. ``database`` may be any
    row-sliceable tensor; each slice is moved to the queries' device and dtype before the matmul."""
    import torch

    n = database.shape[0]
    k = min(k, n)
    best_s = torch.full((queries.shape[0], 0), float("-inf"), device=queries.device, dtype=torch.float32)
    best_i = torch.zeros((queries.shape[0], 0), device=queries.device, dtype=torch.long)
    for start in range(0, n, chunk_rows):
        block = database[start:start + chunk_rows].to(device=queries.device, dtype=queries.dtype)
        s = (queries @ block.T).float()
        top_s, top_i = torch.topk(s, min(k, s.shape[1]), dim=1)
        cand_s = torch.cat([best_s, top_s], dim=1)
        cand_i = torch.cat([best_i, top_i + start], dim=1)
        best_s, pos = torch.topk(cand_s, min(k, cand_s.shape[1]), dim=1)
        best_i = torch.gather(cand_i, 1, pos)
    return best_s, best_i


class TorchIndex:
    """Exact index over a float32 vector file; search runs on ``device`` (fp16 on CUDA)."""

    kind = "torch"
    needs_text = False

    def __init__(self, vectors: np.ndarray, device: str = "cpu", chunk_rows: int = 65536):
        import torch

        self.dim = int(vectors.shape[1])
        self.device = device
        self.chunk_rows = chunk_rows
        if device.startswith("cuda"):
            self.dtype = torch.float16
            self.database = torch.empty(vectors.shape, dtype=self.dtype, device=device)
            for s in range(0, len(vectors), 1 << 20):  # copy in pieces: no full fp32 host copy
                self.database[s:s + (1 << 20)] = torch.from_numpy(np.ascontiguousarray(vectors[s:s + (1 << 20)]))
        else:
            self.dtype = torch.float32
            self.database = torch.from_numpy(vectors)  # shares the (memory-mapped) array

    def __len__(self) -> int:
        return int(self.database.shape[0])

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        import torch

        q = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32)).to(self.device, self.dtype)
        with torch.inference_mode():
            scores, ids = chunked_topk(q, self.database, k, self.chunk_rows)
        return ids.cpu().numpy().astype(np.int64), scores.cpu().numpy().astype(np.float32)

    @staticmethod
    def write(out_dir: Path, vectors: np.ndarray) -> None:
        np.save(Path(out_dir) / VECTORS_FILE, vectors)

    @classmethod
    def load(cls, index_dir: Path, device: str | None = None, index_file: str | None = None,
             **_) -> TorchIndex:
        p = Path(index_dir) / VECTORS_FILE
        if p.is_file() and not index_file:
            vectors = np.load(p, mmap_mode="c")  # copy-on-write map: writable for torch, never copied
        else:  # a flat FAISS file (ours or an imported one): read its vectors out of it
            vectors = flat_vectors(index_file or Path(index_dir) / INDEX_FILE)
        return cls(vectors, device=device or "cpu")
