"""The house rule of CONTRIBUTING.md: a function takes at most eight parameters (past that, a settings
dataclass), bar a documented stand-in for a custom op, which keeps the op's signature."""

from __future__ import annotations

import ast
from pathlib import Path

import mopd

ROOT = Path(mopd.__file__).parent
MOST = 8

# (path under mopd/, function): why it may take more
OP_SIGNATURES = {
    ("train/packed_attention.py", "reference_varlen_attn"): "stands in for torch's varlen_attn (10 arguments)",
}


def long_parameter_lists(root: Path = ROOT):
    """``path:line name (n)`` of every function or method with more than ``MOST`` named parameters
    (``self``/``cls`` not counted; ``*args``/``**kwargs`` neither)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            a = node.args
            names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
            if names[:1] in (["self"], ["cls"]):
                names = names[1:]
            if len(names) > MOST and (rel, node.name) not in OP_SIGNATURES:
                out.append(f"mopd/{rel}:{node.lineno} {node.name} ({len(names)})")
    return out


def test_no_function_in_mopd_takes_more_than_eight_parameters():
    assert long_parameter_lists() == []


def test_the_rule_counts_keyword_only_parameters_and_skips_self(tmp_path):
    (tmp_path / "m.py").write_text(
        "def fine(a, b, c, d, e, f, g, h, *args, **kw):\n    pass\n\n"
        "class C:\n    def method(self, a, b, c, d, e, f, g, h):\n        pass\n\n"
        "def long(a, b, c, d, *, e, f, g, h, i):\n    pass\n")
    assert long_parameter_lists(tmp_path) == ["mopd/m.py:8 long (9)"]


def test_each_allowed_signature_still_exists_and_says_why():
    for (rel, name), why in OP_SIGNATURES.items():
        text = (ROOT / rel).read_text(encoding="utf-8")
        assert f"def {name}(" in text and why
