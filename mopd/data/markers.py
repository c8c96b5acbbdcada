"""Build markers: the small JSON file a finished build (a world, pi_0) leaves in its directory.

A build is reused only when its marker is present, parses, and records the settings asked for, so a
killed build (no marker yet) or a hand-edited, broken marker means "build again", never a crash.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional


def read_marker(path) -> Optional[dict]:
    """The marker's JSON object, or None when it is missing or unreadable."""
    p = Path(path)
    if not p.is_file():
        return None
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None
