"""Which test runs which documented commands: a sequence is the commands of some doc sections, run in
page order in one working directory (a later command reads what an earlier one wrote). Every command
of the pages is in one sequence, run by another test of the project (COVERED_ELSEWHERE), the same text
as a command a sequence runs, or marked in its page with why it cannot run here
(``test_inventory.py`` checks this)."""

from __future__ import annotations

from dataclasses import dataclass

from tests.docs.commands import DocCommand, all_commands


@dataclass(frozen=True)
class Part:
    page: str
    section: str
    only: tuple[str, ...] = ()   # command prefixes; empty: every unmarked command of the section


SEQUENCES: dict[str, tuple[Part, ...]] = {
    # the default suite: commands that load no model (about 3 s each, most of it the import)
    "quick": (
        Part("docs/method.md", "The presets"),
        Part("README.md", "1. Run the built-in demo", only=(".venv/bin/mopd pipeline demo --dry-run",)),
        Part("README.md", "2. Train on GPUs", only=("mopd plan", "mopd pipeline paper --dry-run")),
        Part("docs/gpu_training.md", "The paper's run, step by step", only=("mopd pipeline paper --dry-run",)),
    ),
    "kernels_snippets": (
        Part("kernels/README.md", "mopd-kernels: fused lm-head log-probs and policy losses (GRPO, DAPO, GSPO, CISPO, OPD)",
             only=("import torch",)),
    ),
    # slow: the LoRA section, command by command
    "lora": (Part("docs/gpu_training.md", "LoRA: the paper's Stage II on one GPU"),),
    # slow: the paper's run on the tiny run, its retriever served, its exports evaluated and reported by
    # hand as mopd/eval/README.md shows, and the first check of a model
    "paper": (
        Part("docs/gpu_training.md", "The paper's run, step by step"),
        Part("mopd/eval/README.md", "`mopd.eval`: evaluation as in the paper's Appendix A"),
        Part("docs/gpu_training.md", "Your own model: chat templates, context and a first check"),
    ),
    # slow: the retriever's page: its Python use in-process, then its server started (on the CPU)
    "retriever": (
        Part("mopd/retriever/README.md", "Retriever"),
        Part("mopd/retriever/README.md", "Starting the server for training"),
    ),
    # slow: the demo's smoke run, then the viewer's and the demo page's commands on what it wrote
    "demo": (
        Part("README.md", "1. Run the built-in demo"),
        Part("docs/viewer.md", "Opening it"),
        Part("docs/demo.md", "The demo in the viewer"),
    ),
}

# commands another test of the project runs as the page shows them
COVERED_ELSEWHERE = {
    ("README.md", "import torch\nfrom mopd_kernels import Completions"): "tests/test_readme_kernels.py",
    ("kernels/README.md", "import torch\nfrom mopd_kernels import (FusedLinearPolicyLoss"):
        "kernels/tests/test_kernels_settings.py::test_readme_usage_example_runs",
    ("kernels/README.md", "bash bench/gpu_check.sh --dry-run"): "tests/kernels/test_gpu_check_dryrun.py",
}


def command_key(cmd: DocCommand) -> str:
    """A shell command without its trailing comment (the same command, described twice)."""
    if cmd.lang != "bash":
        return cmd.text
    return cmd.text.split("  #", 1)[0].split(" # ", 1)[0].strip()


def in_part(cmd: DocCommand, part: Part) -> bool:
    return (cmd.page == part.page and cmd.section == part.section and cmd.skip is None
            and (not part.only or cmd.text.startswith(part.only)))


def sequence(name: str, commands: list[DocCommand] | None = None) -> list[DocCommand]:
    """The commands a sequence runs, in order (part by part, page order within a part); a command
    whose text a previous part already ran is run once."""
    commands = all_commands() if commands is None else commands
    out, seen = [], set()
    for part in SEQUENCES[name]:
        for cmd in commands:
            if in_part(cmd, part) and command_key(cmd) not in seen and not covered_elsewhere(cmd):
                seen.add(command_key(cmd))
                out.append(cmd)
    return out


def covered_elsewhere(cmd: DocCommand) -> str | None:
    return next((t for (page, prefix), t in COVERED_ELSEWHERE.items()
                 if cmd.page == page and cmd.text.startswith(prefix)), None)
