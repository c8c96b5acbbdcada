"""The integration tier runs inside the real trainers (.venv-integrations, `make test-integrations`).
Elsewhere its modules are skipped with the reason; with MOPD_REQUIRE_INTEGRATIONS=1 (the make target) a
trainer that is missing fails the run instead."""

import importlib.util
import os

import pytest


def require(package: str) -> None:
    if importlib.util.find_spec(package) is not None:
        return
    reason = f"{package} is not installed here: run make test-integrations (.venv-integrations)"
    if os.environ.get("MOPD_REQUIRE_INTEGRATIONS") == "1":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason, allow_module_level=True)
