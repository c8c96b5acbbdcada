"""A run's per-call limits against the model's context, checked before any engine starts.

A call's prompt (``rollout.max_input_tokens``) plus its output (``rollout.max_output_tokens``)
must fit the positions the model has: ``max_position_embeddings`` of its ``config.json`` and the
tokenizer's ``model_max_length`` when that is set (transformers writes a huge sentinel when it is
not). Past that, the HF engine would silently run off the end of its position table and vLLM
refuses to start. So an input limit past the context is clamped, with one line saying so, and an
output limit that leaves no room for any prompt is refused, naming the keys.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable, Optional, Tuple

from mopd.core.errors import UserError

_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
_NO_LIMIT = 10 ** 8
"""A tokenizer ``model_max_length`` at or above this is transformers' "not set" sentinel."""
MIN_PROMPT_TOKENS = 64
"""The smallest input limit a clamp may leave: below it no role prompt fits."""


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def model_context(model_path: str) -> Tuple[Optional[int], str]:
    """(positions, where they come from) of the model directory; (None, "") when it says nothing."""
    d = Path(model_path)
    config = _read_json(d / "config.json")
    found = []
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    for source in (config, text):
        for key in _POSITION_KEYS:
            v = source.get(key)
            if isinstance(v, int) and v > 0:
                found.append((v, f"{key} in config.json"))
                break
    tok = _read_json(d / "tokenizer_config.json").get("model_max_length")
    if isinstance(tok, (int, float)) and 0 < tok < _NO_LIMIT:
        found.append((int(tok), "model_max_length in tokenizer_config.json"))
    if not found:
        return None, ""
    return min(found)


def fit_limits(max_input: int, max_output: int, context: int, source: str) -> Tuple[int, str]:
    """(input limit, notice): ``max_input`` cut so that input + output fit ``context``; the notice
    is empty when nothing changed. Raises when the output limit leaves no room for a prompt."""
    if max_input + max_output <= context:
        return max_input, ""
    room = context - max_output
    if room < MIN_PROMPT_TOKENS:
        raise UserError(f"rollout.max_output_tokens={max_output} leaves {max(room, 0)} of the model's {context} "
                        f"positions ({source}) for the prompt; lower rollout.max_output_tokens (and "
                        f"rollout.max_input_tokens) to fit the context")
    return room, (f"rollout.max_input_tokens {max_input} clamped to {room}: the model's context is {context} "
                  f"positions ({source}) and rollout.max_output_tokens keeps {max_output} of them for output")


def fit_context(cfg, model_path: str, log: Callable[[str], None] = print):
    """``cfg`` with ``rollout.max_input_tokens`` fitted to the context of the model at
    ``model_path`` (a notice through ``log`` when it is clamped); ``cfg`` itself when it fits."""
    context, source = model_context(model_path)
    if context is None:
        return cfg
    r = cfg.rollout
    limit, notice = fit_limits(r.max_input_tokens, r.max_output_tokens, context, source)
    if not notice:
        return cfg
    log(notice)
    return dataclasses.replace(cfg, rollout=dataclasses.replace(r, max_input_tokens=limit))
