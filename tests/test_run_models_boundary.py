"""One object knows a run's models (docs/architecture.md, "LoRA"): nothing but it reads the LoRA
settings of a config (``cfg.model.lora``), so "does this run train adapters?" and "is this frozen
model a view of the base?" have one answer. The config package declares and checks the settings;
``mopd.core.run_models.RunModels`` reads them; everything else asks it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = ("mopd/config/", "mopd/core/run_models.py")
"""Where ``<x>.model.lora`` may be read: the settings' own section, and the one object."""


def lora_reads(source: str) -> list[int]:
    """Lines of ``source`` that read ``<anything>.model.lora`` (an attribute chain, not a string)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "lora" and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "model":
            lines.append(node.lineno)
    return lines


def test_only_the_run_models_object_reads_the_lora_settings():
    found = []
    for f in sorted((ROOT / "mopd").rglob("*.py")):
        rel = f.relative_to(ROOT).as_posix()
        if rel.startswith(ALLOWED):
            continue
        found += [f"{rel}:{n}" for n in lora_reads(f.read_text(encoding="utf-8"))]
    assert found == [], ("read the run's models through mopd.core.run_models.RunModels (RunModels.from_config) "
                         f"instead of cfg.model.lora: {found}")


def test_the_check_sees_a_read_and_ignores_text():
    assert lora_reads("def f(cfg):\n    return cfg.model.lora.rank\n") == [2]
    assert lora_reads("x = self.cfg.model.lora\n") == [1]
    assert lora_reads("s = 'model.lora.rank=8'\nlora = adapters.lora\n") == []
