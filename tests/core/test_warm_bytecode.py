"""make setup installs without pip's byte-compilation and writes the bytecode of what mopd loads."""

import importlib.util
import sys


def test_warm_writes_bytecode_of_loaded_modules_even_when_writing_is_off(tmp_path, monkeypatch):
    from mopd.core.warm_bytecode import warm

    pkg = tmp_path / "warmpkg_x7"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import inner\n")
    (pkg / "inner.py").write_text("VALUE = 41 + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)   # as under PYTHONDONTWRITEBYTECODE=1
    try:
        compiled, missing = warm(["warmpkg_x7", "no_such_module_q3"])
        assert missing and missing[0].startswith("no_such_module_q3 (ModuleNotFoundError")
        for src in (pkg / "__init__.py", pkg / "inner.py"):   # the package and what it imported
            assert __import__("os").path.isfile(importlib.util.cache_from_source(str(src)))
        assert compiled >= 2
        assert warm(["warmpkg_x7"])[0] == 0   # nothing left to compile
    finally:
        for name in ("warmpkg_x7", "warmpkg_x7.inner"):
            sys.modules.pop(name, None)


def test_every_mopd_module_is_listed_but_the_command_line_entry():
    from mopd.core.warm_bytecode import mopd_modules

    names = mopd_modules()
    assert "mopd.core.warm_bytecode" in names and "mopd.pipeline.run" in names and "mopd_kernels" in names
    assert "mopd.__main__" not in names
