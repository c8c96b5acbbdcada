"""What every engine front's worker thread needs: the caller's CUDA device, and the row count of a
request (the unit a front's batch cap is counted in)."""

from __future__ import annotations

import sys
from typing import Callable

from mopd.core.generation import GenerationRequest


def cuda_device_keeper() -> Callable[[], None]:
    """A function that makes the calling thread's CUDA device current in another thread: a new
    thread starts on device 0, while under torchrun each rank's engine lives on its own device."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return lambda: None
    device = torch.cuda.current_device()
    return lambda: torch.cuda.set_device(device)


def request_rows(request: GenerationRequest) -> int:
    """Engine rows of a request: one per sample."""
    return request.params.n
