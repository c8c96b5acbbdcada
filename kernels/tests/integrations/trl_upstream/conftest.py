"""TRL's own GRPOTrainer tests against FusedGRPOTrainer.

The test file is TRL's ``tests/test_grpo_trainer.py`` as released in the trl 0.23.1 sdist (PyPI),
unchanged: TRL's sdists from 0.24 on (1.16.0 included) leave their tests out, and 0.23.1 is the
newest release whose sdist has them (``TRL_TESTS_VERSION``). The swap is the one line below,
``trl.GRPOTrainer = FusedGRPOTrainer``, made before the test module imports ``GRPOTrainer`` from trl
(``MOPD_UPSTREAM_TRAINER=plain`` leaves TRL's own trainer in place, to see what fails without us).
The hub ids the tests load are tiny models built here into a throwaway Hugging Face cache
(``local_hub.py``), ``load_dataset("trl-internal-testing/zen", ...)`` is served from the same
prompts, and the hub is never contacted (HF_HUB_OFFLINE=1).

Every test passes, or is listed in ``NOT_RUN`` with its reason: a documented refusal of
FusedGRPOTrainer (checked: it must raise ``UnsupportedOption``), or a skip that applies to plain
``GRPOTrainer`` on this CPU-only environment as well (it fails there too, for the reason given).
"""

from __future__ import annotations

import importlib.util
import os
import re
import tempfile
from pathlib import Path

import pytest

TRL_TESTS_VERSION = "0.23.1"

collect_ignore = []
if importlib.util.find_spec("trl") is None:
    # the default environment: nothing here to run (make test-integrations has TRL; there a missing
    # TRL fails the run, as integration_env.require does for the other modules)
    if os.environ.get("MOPD_REQUIRE_INTEGRATIONS") == "1":
        raise RuntimeError("trl is not installed here: run make test-integrations (.venv-integrations)")
    collect_ignore.append("test_grpo_trainer.py")


def _install() -> None:
    """The swap, the CPU config default, the local hub and datasets (before the test module imports)."""
    cache = Path(tempfile.mkdtemp(prefix="mopd_trl_hub_"))
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_HUB_CACHE"] = str(cache)
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    import datasets
    import huggingface_hub.constants
    import trl

    from mopd_kernels.integrations.trl import FusedGRPOTrainer
    from trl_upstream.local_hub import build_hub, zen_dataset

    huggingface_hub.constants.HF_HUB_CACHE = str(cache)  # if it was imported before this conftest
    if os.environ.get("MOPD_UPSTREAM_TRAINER", "fused") == "fused":
        trl.GRPOTrainer = FusedGRPOTrainer  # the swap: TRL's tests now build FusedGRPOTrainer
    config_init = trl.GRPOConfig.__init__

    def cpu_config_init(self, *args, use_cpu=True, **kwargs):
        """TRL's tests run on its GPU CI; here every GRPOConfig (of either trainer) says ``use_cpu=True``,
        without which transformers refuses TRL's default ``bf16=True`` on a machine without a GPU."""
        config_init(self, *args, use_cpu=use_cpu, **kwargs)

    trl.GRPOConfig.__init__ = cpu_config_init
    load_dataset = datasets.load_dataset

    def local_load_dataset(path, name=None, *args, split=None, **kwargs):
        if path == "trl-internal-testing/zen":
            return zen_dataset(name, split)
        return load_dataset(path, name, *args, split=split, **kwargs)

    datasets.load_dataset = local_load_dataset
    build_hub(cache)


if not collect_ignore:
    _install()

REFUSED = "refused by FusedGRPOTrainer in one line (documented in kernels/README.md): "
PLAIN_TOO = "fails for plain trl.GRPOTrainer 1.16 on this CPU too: "
NOT_RUN = {
    "test_training_with_mask_truncated_completions": PLAIN_TOO + "the test writes Qwen2.5's pad and eos ids "
                                                      "(151643, 151645) into completions, past the tiny models' "
                                                      "512-token vocabulary (IndexError in the embedding)",
    "test_training_with_mask_truncated_completions_all_masked": PLAIN_TOO + "it counts on a random model never "
                                                                "sampling eos in 8 tokens, which a 512-token "
                                                                "vocabulary does (a parameter then changes)",
    "test_training_with_sync_ref_model": PLAIN_TOO + "TRL 1.x's default beta is 0.0, and sync_ref_model=True with "
                                         "beta=0.0 is a ValueError there (the 0.23.1 test relies on beta=0.04)",
}
"""Test name (without parameters) -> why it is not run as a pass. ``REFUSED`` ones must raise
``UnsupportedOption``; the others are skipped with the reason."""


def _reason(name: str):
    """``NOT_RUN``'s entry for a test, by its name or the name ``parameterized.expand`` made it from
    (``test_training_0_standard_prompt_only`` -> ``test_training``)."""
    if name in NOT_RUN:
        return NOT_RUN[name]
    base = re.match(r"(.*?)_\d+(_.*)?$", name)
    return NOT_RUN.get(base.group(1)) if base else None


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).parent != here:
            continue
        item.add_marker(pytest.mark.integration)
        reason = _reason(item.name)
        if reason and reason.startswith(REFUSED):
            from mopd_kernels.integrations.trl import UnsupportedOption

            item.add_marker(pytest.mark.xfail(raises=UnsupportedOption, strict=True, reason=reason))
        elif reason:
            item.add_marker(pytest.mark.skip(reason=reason))
