"""Answer extraction and exact-match scoring (the paper's Appendix A).

Public API used by the method, the rollout and the evaluation:
``normalize_answer``, ``extract_answer`` (strict), ``exact_match``, ``flexible_extract``,
``classify_failure``.
"""

from __future__ import annotations

import re
import string
from typing import Iterable, Optional

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)  # ASCII punctuation only, exactly as SQuAD v1.1

_STRICT = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# Tags differing only in case or internal whitespace: "< Answer >", "<ANSWER>", "</ answer>".
_LOOSE_OPEN = r"<\s*answer\s*>"
_LOOSE_CLOSE = r"<\s*/\s*answer\s*>"
_LOOSE_PAIR = re.compile(_LOOSE_OPEN + r"(.*?)" + _LOOSE_CLOSE, re.DOTALL | re.IGNORECASE)
_LOOSE_OPEN_RE = re.compile(_LOOSE_OPEN, re.IGNORECASE)
_LOOSE_CLOSE_RE = re.compile(_LOOSE_CLOSE, re.IGNORECASE)
_ANSWER_LINE = re.compile(r"^\s*(?:final\s+answer|answer)\s*:\s*(.*?)\s*$", re.IGNORECASE)

MAX_FLEX_CHARS = 128


def normalize_answer(s: str) -> str:
    """SQuAD v1.1 normalisation: lowercase, drop ASCII punctuation, drop articles, collapse spaces."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def extract_answer(text: Optional[str]) -> Optional[str]:
    """Strict rule: the text inside the LAST complete ``<answer>...</answer>``; None if there is none."""
    if not text:
        return None
    matches = _STRICT.findall(text)
    if not matches:
        return None
    return matches[-1].strip()


def exact_match(prediction: Optional[str], references: Iterable[str]) -> float:
    """1.0 when the normalised prediction equals any normalised reference; None scores 0.0."""
    if prediction is None:
        return 0.0
    p = normalize_answer(prediction)
    return 1.0 if any(p == normalize_answer(r) for r in references) else 0.0


def _plain_single_line(s: str) -> bool:
    """1-128 characters, one line, no angle brackets and no Markdown code fences."""
    return (0 < len(s) <= MAX_FLEX_CHARS and "\n" not in s and "\r" not in s
            and "<" not in s and ">" not in s and "```" not in s)


def flexible_extract(text: Optional[str]) -> Optional[str]:
    """The paper's six ordered extraction rules; it never sees the reference.

    1. the strict answer, unchanged;
    2. a paired tag differing in case or internal whitespace (last pair);
    3. a single unclosed opening tag followed by 1-128 characters of single-line plain text;
    4. a trailing ``Final answer:`` / ``Answer:`` line with a 1-128 character plain-text candidate;
    5. the whole output when it is 1-128 characters of single-line plain text;
    6. otherwise None (unparsed, scored incorrect).
    """
    if text is None:
        return None
    strict = extract_answer(text)
    if strict is not None:
        return strict
    pairs = _LOOSE_PAIR.findall(text)
    if pairs:
        return pairs[-1].strip()
    opens = list(_LOOSE_OPEN_RE.finditer(text))
    if len(opens) == 1 and not _LOOSE_CLOSE_RE.search(text):
        rest = text[opens[0].end():].strip()
        if _plain_single_line(rest):
            return rest
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    if lines:
        m = _ANSWER_LINE.match(lines[-1])
        if m and _plain_single_line(m.group(1)):
            return m.group(1)
    whole = text.strip()
    if _plain_single_line(whole):
        return whole
    return None


def classify_failure(candidates: list) -> Optional[str]:
    """Format-failure type of a workflow's final Answerer output.

    ``no_candidate`` (no Answerer output at all), ``empty_candidate`` (the final one is empty or
    whitespace), ``no_valid_tag`` (non-empty, no strict answer tag), or None when it has a valid tag.
    """
    if not candidates:
        return "no_candidate"
    last = candidates[-1]
    if last is None or not str(last).strip():
        return "empty_candidate"
    if extract_answer(last) is None:
        return "no_valid_tag"
    return None
