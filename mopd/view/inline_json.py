"""JSON that may sit inside the page's ``<script>`` element whatever the records' texts hold.

A record's text is anything a model wrote: ``</script>``, ``<!--<script>`` (which puts the HTML
parser in the "script data double escaped" state, so the element no longer ends at its
``</script>`` and the page's own script never runs), U+2028/U+2029, or a lone UTF-16 surrogate
(``"\\ud800"`` is valid JSON and Python reads it, but it is no character and cannot be written as
UTF-8). :func:`inline_json` writes ``<``, ``>``, ``&``, U+2028 and U+2029 as JSON ``\\u`` escapes
(so no markup can start inside the element: JSON.parse gives the same strings back) and every lone
surrogate as U+FFFD. :func:`no_surrogates` does the latter for any text (the page's title, a path).
"""

from __future__ import annotations

import json
import re

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
"""In a Python str read from JSON a valid pair is already one character, so any surrogate left is lone."""
_UNSAFE = re.compile("[<>&\u2028\u2029]")
REPLACEMENT = "\ufffd"


def no_surrogates(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD (writable as UTF-8)."""
    return _LONE_SURROGATE.sub(REPLACEMENT, text)


def inline_json(value) -> str:
    """``value`` as compact JSON that no HTML parser state can end or comment out inside a
    ``<script>`` element (the characters above escaped; JSON syntax outside strings has none of them)."""
    text = no_surrogates(json.dumps(value, ensure_ascii=False, separators=(",", ":")))
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
