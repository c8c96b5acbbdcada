"""The shell commands of the GPU guide's step-by-step block (docs/gpu_training.md, which the README
links for training on GPUs), for tests that check they parse."""

import shlex
from pathlib import Path

GPU_GUIDE = Path(__file__).resolve().parents[2] / "docs" / "gpu_training.md"


def gpu_section_commands(prefix: str) -> list[list[str]]:
    """argv (after ``mopd``) of each command in the GPU guide's "The paper's run, step by step"
    block that starts with ``mopd PREFIX`` (backslash continuations joined, ``&`` and comments cut)."""
    text = GPU_GUIDE.read_text(encoding="utf-8")
    section = text.split("## The paper's run, step by step", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    commands, current = [], ""
    for line in block.splitlines():
        if not current and line.lstrip().startswith("#"):
            continue
        current += line.rstrip("\\").rstrip() + " "
        if not line.endswith("\\"):
            argv = shlex.split(current, comments=True)
            current = ""
            if argv and argv[-1] == "&":
                argv = argv[:-1]
            if argv[:1] == ["mopd"] and " ".join(argv[1:]).startswith(prefix):
                commands.append(argv[1:])
    return commands
