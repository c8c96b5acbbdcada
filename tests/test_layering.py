"""The import-direction rule of docs/architecture.md: a package imports only packages below it."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import mopd

ROOT = Path(mopd.__file__).parent

# Each package and what it may import of ours (docs/architecture.md, "Layers").
ALLOWED = {
    "config": set(),
    "core": {"config"},
    "kernels": set(),
    "retriever": {"config", "core"},
    "rollout": {"config", "core", "retriever"},
    "algo": {"config", "core", "kernels"},
    "eval": {"config", "core", "retriever", "rollout", "algo"},
    "data": {"config", "core", "retriever", "rollout", "algo", "eval"},
    "train": {"config", "core", "kernels", "retriever", "rollout", "algo", "eval", "data"},
}
TOP = {"cli", "commands", "demo", "demo_tables", "__main__", "__init__"}


def _package_of(path: Path, root: Path) -> str:
    rel = path.relative_to(root)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name


def upward_imports(root: Path = ROOT):
    bad = []
    for path in sorted(root.rglob("*.py")):
        pkg = _package_of(path, root)
        if pkg in TOP:
            continue
        assert pkg in ALLOWED, f"{path}: package {pkg!r} has no place in the layering table"
        for line, mod in _imports(path):
            parts = mod.split(".")
            if parts[0] != "mopd" or len(parts) < 2:
                continue
            target = parts[1]
            if target != pkg and target not in ALLOWED[pkg]:
                bad.append(f"{path.relative_to(root.parent)}:{line} ({pkg}) imports {mod}")
    return bad


def test_no_package_imports_upwards():
    assert upward_imports() == []


def test_the_rule_catches_an_upward_import(tmp_path):
    # A core module that imports the trainer must be reported.
    fake = tmp_path / "mopd"
    (fake / "core").mkdir(parents=True)
    (fake / "core" / "x.py").write_text("from mopd.train.trainer import PolicyTrainer\n")
    (fake / "core" / "y.py").write_text("from mopd.config import Config\n")
    assert upward_imports(fake) == ["mopd/core/x.py:1 (core) imports mopd.train.trainer"]


def test_kernels_import_only_torch_and_triton():
    for path in (ROOT / "kernels").rglob("*.py"):
        for _, mod in _imports(path):
            top = mod.split(".")[0]
            assert top in {"torch", "triton", "mopd", *sys.stdlib_module_names}, f"{path}: imports {mod}"
