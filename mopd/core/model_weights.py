"""Do a model directory's weight files load, fit its ``config.json`` and its tokenizer? One line saying why not.

transformers reports these only while loading, and not in one line: a truncated safetensors file
raises ``SafetensorError: incomplete metadata, file not fully covered`` naming no file; a
``config.json`` of another model size prints a table of mismatched tensors and raises "look at the
above report"; a tokenizer with more tokens than the embedding has rows loads fine and fails (or
reads another row's memory on a GPU) the first time such a token is embedded. The checks here read
only the safetensors headers (a few KiB per file) and build the model from its config on the meta
device (no memory, no weights), so they run before anything loads.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from mopd.core.model_dir import remote_code_trusted

SAFETENSORS_INDEX = "model.safetensors.index.json"
MAX_HEADER = 100 << 20       # safetensors' own limit on a header


def safetensors_files(path: Path) -> list[Path]:
    """The safetensors files of a model directory: those its index names, else every ``*.safetensors``."""
    index = path / SAFETENSORS_INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map") or {}
            return [path / name for name in sorted(set(weight_map.values()))]
        except (ValueError, AttributeError, UnicodeDecodeError):
            return sorted(path.glob("*.safetensors"))
    return sorted(path.glob("*.safetensors"))


def read_safetensors_header(f: Path) -> tuple[dict | None, str | None]:
    """``(tensors, None)``: ``{name: shape}`` of a complete safetensors file, or ``(None, why not)``."""
    if not f.is_file():
        return None, f"{f.name} is missing (named in {SAFETENSORS_INDEX})"
    size = f.stat().st_size
    with open(f, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            return None, f"{f.name} is {size} bytes: truncated (not even a safetensors header)"
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            return None, f"{f.name} is truncated or not a safetensors file ({size:,} bytes, its header claims {n:,})"
        raw = fh.read(n)
    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None, f"{f.name} has a damaged safetensors header (not JSON)"
    if not isinstance(header, dict):
        return None, f"{f.name} has a damaged safetensors header"
    tensors, end = {}, 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            b, e = info["data_offsets"]
            tensors[name] = tuple(int(d) for d in info["shape"])
        except (KeyError, TypeError, ValueError):
            return None, f"{f.name} has a damaged safetensors header (tensor {name})"
        end = max(end, int(e))
    expected = 8 + n + end
    if size != expected:
        what = "truncated" if size < expected else "longer than its header says"
        return None, (f"{f.name} is {what}: {size:,} bytes, its header describes {expected:,} (an interrupted copy "
                      "or download?); copy the model again")
    return tensors, None


def checkpoint_shapes(path: Path) -> tuple[dict, dict, str | None]:
    """``({tensor: shape}, {tensor: file name}, problem)`` over all safetensors files of ``path``."""
    shapes, where = {}, {}
    for f in safetensors_files(path):
        tensors, problem = read_safetensors_header(f)
        if problem:
            return shapes, where, problem
        for name, shape in tensors.items():
            shapes[name], where[name] = shape, f.name
    return shapes, where, None


def _meta_model(path: Path):
    """The model of ``path``'s config.json on the meta device (None where that cannot be built:
    remote code, quantised weights, an error of transformers itself)."""
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(config, dict) or config.get("quantization_config") or config.get("auto_map"):
        return None
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(path), trust_remote_code=remote_code_trusted()))
    except Exception:  # noqa: BLE001 (what cannot be checked here is left to the loader)
        return None


def _embedding_name(model) -> str | None:
    emb = model.get_input_embeddings()
    weight = getattr(emb, "weight", None)
    for name, p in model.named_parameters(remove_duplicate=False):
        if p is weight:
            return name
    return None


def weights_problem(path: str | Path, tokenizer_len: int | None = None) -> str | None:
    """``None`` if the weights of model directory ``path`` are complete, have the shapes its
    ``config.json`` gives them, and (given ``tokenizer_len``, its tokenizer's ``len``) an embedding
    row for every token; else why not, as one sentence that names the file."""
    p = Path(path)
    shapes, where, problem = checkpoint_shapes(p)
    if problem:
        return f"{p}: {problem}"
    if not shapes:                                  # .bin weights or a Hub id: left to the loader
        return None
    model = _meta_model(p)
    if model is None:
        return None
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    bad = [k for k in expected if k in shapes and shapes[k] != expected[k]]
    if bad:
        k = bad[0]
        more = f" (and {len(bad) - 1} more tensors)" if len(bad) > 1 else ""
        return (f"{p / 'config.json'} does not match the weights: {k} is {list(shapes[k])} in {where[k]} but "
                f"config.json makes it {list(expected[k])}{more}; the config.json is of another model (size)")
    emb = _embedding_name(model)
    rows = shapes[emb][0] if emb in shapes else expected.get(emb, (None,))[0] if emb else None
    if tokenizer_len is not None and rows is not None and tokenizer_len > rows:
        return tokenizer_problem(p, tokenizer_len, rows)
    return None


def tokenizer_length(path: str | Path) -> int | None:
    """``len`` of the tokenizer of ``path`` (None where it does not load: the loader says why)."""
    try:
        from transformers import AutoTokenizer

        return len(AutoTokenizer.from_pretrained(str(path), trust_remote_code=remote_code_trusted()))
    except Exception:  # noqa: BLE001 (reported where the model loads)
        return None


def tokenizer_problem(path: str | Path, tokenizer_len: int, rows: int) -> str | None:
    """The line for a tokenizer with more tokens than the model's embedding has rows (None when it fits)."""
    if tokenizer_len <= rows:
        return None
    return (f"{path}: the tokenizer has {tokenizer_len} tokens but the model's embedding has {rows} rows, so token "
            f"ids {rows} and up have no embedding; use this model's own tokenizer files (or resize the embeddings "
            "and save the model again)")


def load_failure(path: str | Path, error: BaseException) -> str:
    """One line for a failure of transformers' ``from_pretrained`` on ``path``: what the checks
    above find, else the error's own first line."""
    problem = weights_problem(path) if Path(path).is_dir() else None
    if problem:
        return problem
    first = next((ln.strip() for ln in str(error).splitlines() if ln.strip()), "")
    return f"cannot load the model in {path} ({type(error).__name__}: {first[:300]})"
