"""Parameter names as Hugging Face writes them: what wrappers insert into a module's names, removed."""

from __future__ import annotations

WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")
"""Module names that wrappers (activation checkpointing, torch.compile, FSDP1) insert into
parameter names; the engine knows the plain Hugging Face names."""


def engine_name(name: str) -> str:
    """The Hugging Face parameter name with every wrapper's component removed."""
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name
