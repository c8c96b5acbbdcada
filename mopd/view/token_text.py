"""Per-token text and values for the page: token ids decoded one by one, values quantised.

Records store each segment's decoded text and, when written with token ids, its ids; a token's own
text is the run's tokenizer's decoding of that one id (cached per id). A value (a log-prob, an
advantage) is kept to 0.01 as an integer count of hundredths: enough to colour a token and to read
it on hover, and a third of the bytes of a float.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

SCALE = 100
"""Values are stored as round(value * SCALE)."""


class TokenDecoder:
    """Each token id's own text, by a Hugging Face tokenizer (None: no per-token text)."""

    def __init__(self, tokenizer=None):
        self.tokenizer = tokenizer
        self._cache: Dict[int, str] = {}
        self._fast = getattr(tokenizer, "backend_tokenizer", None)

    def __bool__(self) -> bool:
        return self.tokenizer is not None

    def pieces(self, ids: Sequence[int]) -> List[str]:
        out = []
        for i in ids:
            p = self._cache.get(i)
            if p is None:
                p = self._fast.decode([i], skip_special_tokens=False) if self._fast is not None else \
                    self.tokenizer.decode([i], skip_special_tokens=False)
                self._cache[i] = p
            out.append(p)
        return out


def quantise(values: Sequence[float]) -> List[int]:
    return [int(round(v * SCALE)) for v in values]


def split_by_turn(values: Sequence[float], lengths: Sequence[int]) -> Optional[List[List[float]]]:
    """A call's per-model-token values cut into its turns (``lengths`` tokens each); None when the
    counts disagree (values of another tokenisation)."""
    if len(values) != sum(lengths):
        return None
    out, at = [], 0
    for n in lengths:
        out.append(list(values[at:at + n]))
        at += n
    return out


def opd_signal(signals: Dict[str, List[float]]) -> Optional[List[float]]:
    """teacher - old (the OPD log-ratio before its coefficient) where both exist, else None."""
    teacher, old = signals.get("teacher"), signals.get("old")
    if teacher is None or old is None or len(teacher) != len(old):
        return None
    return [t - o for t, o in zip(teacher, old)]
