"""KEY=VALUE settings from the command line (a recipe's ``--world KEY=VALUE ...``, a pipeline's
setup-stage settings), typed by the dataclass they configure."""

from __future__ import annotations

import dataclasses
from typing import Dict, Iterable

TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def parse_value(text: str, default):
    """``text`` as the type of ``default``: bool (true/false, 1/0, yes/no, on/off), int, float or str;
    a default of None takes an int, or ``none`` for None. Raises ValueError naming the type."""
    if default is None:
        return None if text.lower() == "none" else int(text)
    if isinstance(default, bool):
        if text.lower() in TRUE:
            return True
        if text.lower() in FALSE:
            return False
        raise ValueError("not a bool (true or false)")
    return type(default)(text)


def parse_key_values(items: Iterable[str], settings_type, *, what: str,
                     exclude: Iterable[str] = ()) -> Dict[str, object]:
    """``{field: value}`` from KEY=VALUE ``items``, each KEY a field of the dataclass
    ``settings_type`` (not in ``exclude``), each VALUE typed like that field's default (which every
    field must have). The last entry for a key wins. Errors are ``ValueError`` naming the entry."""
    defaults = settings_type()
    names = sorted(f.name for f in dataclasses.fields(settings_type) if f.name not in set(exclude))
    out: Dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in names:
            raise ValueError(f"{what} setting {item!r}: expected KEY=VALUE with KEY one of {names}")
        default = getattr(defaults, key)
        try:
            out[key] = parse_value(value, default)
        except ValueError:
            kind = "int (or none)" if default is None else type(default).__name__
            raise ValueError(f"{what} setting {item!r}: {value!r} is not a {kind}") from None
    return out
