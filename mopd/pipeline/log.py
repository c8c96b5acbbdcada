"""The pipeline's progress lines: one timestamped line per event on stderr, prefixed with the
pipeline's name (``[paper 12:03:41] Stage I: training 15 steps ...``)."""

from __future__ import annotations

import sys
import time
from typing import Callable


def logger(name: str) -> Callable[[str], None]:
    """A function that prints one progress line of pipeline ``name``."""

    def log(msg: str) -> None:
        print(f"[{name} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    return log
