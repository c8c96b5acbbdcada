"""The import-direction rules of docs/architecture.md: a package imports only packages below it, and no
module imports itself through others."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import mopd
import mopd_kernels

ROOT = Path(mopd.__file__).parent
KERNELS = Path(mopd_kernels.__file__).parent

# Each package and what it may import of ours (docs/architecture.md, "Layers").
ALLOWED = {
    "core": set(),
    "config": {"core"},
    "retriever": {"config", "core"},
    "rollout": {"config", "core", "retriever"},
    "algo": {"config", "core"},
    "eval": {"config", "core", "retriever", "rollout", "algo"},
    "data": {"config", "core", "retriever", "rollout", "algo", "eval"},
    "train": {"config", "core", "retriever", "rollout", "algo", "eval", "data"},
    "pipeline": {"config", "core", "retriever", "rollout", "algo", "eval", "data", "train"},
    # the viewer reads records and traces (core, eval) and scores with the trainer's frozen models (train)
    "view": {"config", "core", "retriever", "rollout", "algo", "eval", "data", "train"},
    # recipes (mopd/recipes/: worlds and experiments beside the core) may use all of it; nothing imports them
    "recipes": {"config", "core", "retriever", "rollout", "algo", "eval", "data", "train", "view", "pipeline"},
}
TOP = {"cli", "commands", "__main__", "__init__"}


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


def _recipe_imports(path: Path):
    """(line, module) of each import of ``mopd.recipes`` or a module under it (``from mopd import
    recipes`` too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + ([f"mopd.{a.name}" for a in node.names] if node.module == "mopd" else [])
        for mod in names:
            if mod == "mopd.recipes" or mod.startswith("mopd.recipes."):
                yield node.lineno, mod


def recipe_users(root: Path = ROOT):
    """Imports of a recipe from outside mopd/recipes/ (the core finds recipes by discovery,
    mopd.core.recipes, and never names one)."""
    return [f"{path.relative_to(root.parent)}:{line} imports {mod}"
            for path in sorted(root.rglob("*.py")) if _package_of(path, root) != "recipes"
            for line, mod in _recipe_imports(path)]


OUTSIDE = ("tests", "bench", "scripts")
"""Folders beside mopd/ that stand without the recipes too: the core's tests, benches and scripts;
a recipe's own tests and benches live in tests/recipes/<name>/ and bench/recipes/<name>/."""


def recipe_users_outside(repo: Path = ROOT.parent):
    """Imports of a recipe in tests/, bench/ and scripts/, but their recipes/ folders."""
    out = []
    for top in OUTSIDE:
        for path in sorted((repo / top).rglob("*.py")):
            rel = path.relative_to(repo)
            if rel.parts[1:2] != ("recipes",):
                out += [f"{rel.as_posix()}:{line} imports {mod}" for line, mod in _recipe_imports(path)]
    return out


def test_nothing_outside_the_recipes_imports_one():
    assert recipe_users() == []


def test_the_cores_tests_benches_and_scripts_import_no_recipe():
    assert recipe_users_outside() == []


def test_the_rule_checks_tests_benches_and_scripts_but_the_recipes_own(tmp_path):
    for rel, text in {"tests/train/test_x.py": "from mopd.recipes.w.model import init\n",
                      "tests/recipes/w/test_y.py": "from mopd.recipes.w.model import init\n",
                      "bench/bench_z.py": "import os\nfrom mopd import recipes\n",
                      "bench/recipes/w/tool.py": "import mopd.recipes.w\n",
                      "scripts/s.py": "def f():\n    import mopd.recipes.w.world as w\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert recipe_users_outside(tmp_path) == ["tests/train/test_x.py:1 imports mopd.recipes.w.model",
                                              "bench/bench_z.py:2 imports mopd.recipes",
                                              "scripts/s.py:2 imports mopd.recipes.w.world"]


def test_the_rule_catches_an_import_of_a_recipe(tmp_path):
    fake = tmp_path / "mopd"
    (fake / "train").mkdir(parents=True)
    (fake / "recipes" / "w").mkdir(parents=True)
    (fake / "train" / "x.py").write_text("import os\nfrom mopd.recipes.w.presets import lr\n")
    (fake / "recipes" / "w" / "presets.py").write_text("from mopd.train.trainer import PolicyTrainer\n")
    assert recipe_users(fake) == ["mopd/train/x.py:2 imports mopd.recipes.w.presets"]
    assert upward_imports(fake) == ["mopd/train/x.py:2 (train) imports mopd.recipes.w.presets"]   # and the recipe may import the trainer


def test_the_rule_catches_an_upward_import(tmp_path):
    # A core module that imports the trainer, or the config (which reads the core's tables), must be
    # reported; the config reading the role table must not.
    fake = tmp_path / "mopd"
    (fake / "core").mkdir(parents=True)
    (fake / "core" / "x.py").write_text("from mopd.train.trainer import PolicyTrainer\n")
    (fake / "core" / "y.py").write_text("from mopd.core.roles import role_names\n")
    (fake / "core" / "z.py").write_text("import os\n\nfrom mopd.config import Config\n")
    (fake / "config.py").write_text("from mopd.core.roles import role_names\nfrom mopd_kernels.role_spec import RoleSpec\n")
    assert upward_imports(fake) == ["mopd/core/x.py:1 (core) imports mopd.train.trainer",
                                    "mopd/core/z.py:3 (core) imports mopd.config"]


# Which mopd packages may use the fused loss head (the separate distribution mopd_kernels, kernels/):
# the config (its torch-free RoleSpec), the pure learning-signal maths, the trainer and the pipeline.
USES_KERNELS = {"config", "algo", "train", "pipeline"}


def kernel_users(root: Path = ROOT):
    bad = []
    for path in sorted(root.rglob("*.py")):
        pkg = _package_of(path, root)
        if pkg in TOP or pkg in USES_KERNELS:
            continue
        bad += [f"{path.relative_to(root.parent)}:{line} ({pkg}) imports {mod}"
                for line, mod in _imports(path) if mod.split(".")[0] == "mopd_kernels"]
    return bad


def test_only_the_loss_side_imports_the_kernels():
    assert kernel_users() == []


def test_kernels_import_only_torch_and_triton():
    """mopd_kernels is reused by other projects with torch alone: it imports nothing of mopd, and its
    integrations (mopd_kernels.integrations) are the only modules that import a trainer."""
    trainers = {"trl", "verl", "transformers", "accelerate", "datasets"}
    baselines = {"liger_kernel", "trl"}  # python -m mopd_kernels.bench: optional baselines, imported when asked
    for path in KERNELS.rglob("*.py"):
        rel = path.relative_to(KERNELS)
        extra = trainers if "integrations" in rel.parts else baselines if rel.parts == ("bench.py",) else set()
        for _, mod in _imports(path):
            top = mod.split(".")[0]
            allowed = {"torch", "triton", "mopd_kernels", *sys.stdlib_module_names}
            assert top in allowed | extra, f"{path}: imports {mod}"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.with_suffix("").relative_to(root.parent).parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(node, current: str, is_package: bool, modules):
    """Our modules an import statement reaches (relative imports resolved; ``from pkg import mod``
    names the submodule, ``from mod import name`` the module)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in modules]
    base = node.module or ""
    if node.level:
        here = current.split(".") if is_package else current.split(".")[:-1]
        here = here[:len(here) - (node.level - 1)]
        base = ".".join(here + ([node.module] if node.module else []))
    out = []
    for a in node.names:
        if f"{base}.{a.name}" in modules:
            out.append(f"{base}.{a.name}")
        elif base in modules:
            out.append(base)
    return out


def module_cycles(root: Path = ROOT):
    """Groups of our modules that import each other, directly or through others (every import
    counts, a function's lazy one too: a factory that imports a backend which imports the factory
    back is a cycle)."""
    paths = {_module_name(p, root): p for p in root.rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                deps.update(_targets(node, name, path.name == "__init__.py", paths))
        deps.discard(name)
        graph[name] = sorted(deps)
    # Tarjan's strongly connected components, iteratively
    index, low, on_stack, stack, cycles, counter = {}, {}, set(), [], [], [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter[0]
                counter[0] += 1
                stack.append(v)
                on_stack.add(v)
            if i < len(graph[v]):
                work.append((v, i + 1))
                w = graph[v][i]
                if w not in index:
                    work.append((w, 0))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                group = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    group.append(w)
                    if w == v:
                        break
                if len(group) > 1:
                    cycles.append(sorted(group))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return sorted(cycles)


def test_no_module_imports_itself_through_others():
    assert module_cycles() == []


def test_the_cycle_check_catches_a_lazy_import_back(tmp_path):
    fake = tmp_path / "mopd"
    (fake / "rollout").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "rollout" / "__init__.py").write_text("")
    (fake / "rollout" / "factory.py").write_text(
        "def helper():\n    pass\n\ndef build():\n    from mopd.rollout.backend import Backend\n    return Backend()\n")
    (fake / "rollout" / "backend.py").write_text("from mopd.rollout.factory import helper\n\nclass Backend:\n    pass\n")
    (fake / "rollout" / "leaf.py").write_text("from . import backend\n")
    assert module_cycles(fake) == [["mopd.rollout.backend", "mopd.rollout.factory"]]


def test_the_core_does_not_name_the_tiny_world():
    """The tiny world is a recipe: outside mopd/recipes/ no code, comment or docstring names its
    presets (tiny_*) or the world itself."""
    bad = [f"{path.relative_to(ROOT.parent)}:{i}" for path in sorted(ROOT.rglob("*.py"))
           if _package_of(path, ROOT) != "recipes"
           for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
           if "tiny_" in line or "tiny world" in line.lower() or "tinyworld" in line]
    assert bad == []
