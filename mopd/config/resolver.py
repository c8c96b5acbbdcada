"""One resolver for every config made of nested dataclasses: the run's (:func:`mopd.config.resolve`)
and a pipeline's (:func:`mopd.pipeline.presets.resolve_pipeline`).

A config is resolved in three layers: a base (a preset's dataclass, or the defaults), then a YAML
file, then dotted overrides (``trainer.lr=2e-6``, ``--trainer.lr 2e-6`` or ``--trainer.lr=2e-6``).
Typing and unknown keys are checked by OmegaConf's structured configs, the ranges and cross-field
rules by each dataclass's ``__post_init__``; every failure is one line that names the key (and, for
an unknown key, the close matches and the valid keys around it). What differs between the two kinds
of config (the words in the errors, key aliases, maps that take any key) is a :class:`ConfigKind`.

OmegaConf is imported inside the functions: the GPU image builds configs from presets without it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence, Tuple

from mopd.config.checks import ConfigError


def _same_key(key: str) -> str:
    return key


def _nothing(_node) -> None:
    return None


@dataclass(frozen=True)
class ConfigKind:
    """What the resolver needs to know of one kind of config."""

    noun: str = "config"
    """The word of its errors: ``unknown NOUN key``, ``NOUN file PATH``."""
    what: str = "config"
    """What a value error that names no key calls the whole thing (``bad WHAT: ...``)."""
    canonical_key: Callable[[str], str] = _same_key
    """A dotted key as the schema spells it (aliases: ``algo.searcher`` for ``algo.roles.searcher``)."""
    canonical_yaml: Callable[[Any], None] = _nothing
    """The same for a loaded YAML layer, in place."""
    open_maps: Tuple[str, ...] = ()
    """Keys of maps that take any key (``model.chat_template_kwargs.enable_thinking=false``)."""
    key_help: str = ""
    """Said after an unknown key's error (where the key may belong instead)."""
    check_merged: Callable[[Any], None] = _nothing
    """Checks of the merged layers that must name a full key, before the dataclasses are built."""


def normalize_overrides(args: Sequence[str]) -> List[str]:
    """Turn ``--a.b 3``, ``--a.b=3`` and ``a.b=3`` into OmegaConf dotlist items ``a.b=3``."""
    out, i = [], 0
    while i < len(args):
        a = args[i]
        if a.startswith("--"):
            a = a[2:]
            if "=" not in a:
                if i + 1 >= len(args):
                    raise ConfigError(f"override --{a} has no value")
                a = f"{a}={args[i + 1]}"
                i += 1
        if "=" not in a:
            raise ConfigError(f"override {a!r} is not of the form key=value or --key value")
        out.append(a)
        i += 1
    return out


class UnknownKey(ConfigError):
    """A key the schema does not have (:func:`merge_layers` adds the valid keys and close matches)."""

    def __init__(self, key: str):
        super().__init__(f"unknown config key {key!r}")
        self.key = key


@contextlib.contextmanager
def omegaconf_errors(what: str = "config"):
    """OmegaConf's and the dataclass checks' errors inside the block as one-line ``ConfigError``s:
    a bad value names its key; anything else is ``bad WHAT: ...``."""
    from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

    try:
        yield
    except ConfigKeyError as e:
        raise UnknownKey(getattr(e, "full_key", None) or str(e)) from None
    except ValidationError as e:
        msg = (e.msg or str(e) or type(e).__name__).splitlines()[0]
        key = getattr(e, "full_key", None)
        raise ConfigError(f"bad value for {key!r}: {msg}" if key else f"bad {what}: {msg}") from None
    except OmegaConfBaseException as e:
        raise ConfigError(f"bad {what}: {str(e).splitlines()[0]}") from None
    except ConfigError:
        raise
    except ValueError as e:   # a check in a dataclass's __post_init__
        raise ConfigError(str(e)) from None


def valid_keys(node, prefix: str = "") -> List[str]:
    """Every leaf key of a (merged) OmegaConf node, dotted; maps and sections are walked into."""
    from omegaconf import DictConfig

    keys = []
    for k in node.keys():
        child = node._get_node(k)
        full = f"{prefix}{k}"
        if isinstance(child, DictConfig) and child._is_none() is False:   # a section, or a map's entry
            keys.extend(valid_keys(child, full + "."))
        else:
            keys.append(full)
    return keys


def empty_string(schema, key: str, value: str) -> str:
    """An override's value as OmegaConf should read it: ``key=`` (nothing after the ``=``) is the
    empty string for a string field (``data.dev=``: no dev set, ``teacher.path=``: no teacher),
    where OmegaConf would read null and refuse it; elsewhere (an Optional field) it stays null."""
    from omegaconf import StringNode

    if value != "":
        return value
    node = schema
    try:
        for part in key.split("."):
            node = node._get_node(part)
    except (AttributeError, KeyError, TypeError, ValueError):
        return value
    if isinstance(node, StringNode) and not node._is_optional():
        return "''"
    return value


def check_yaml_shape(name: str, layer, schema, noun: str = "config") -> None:
    """A config file is a mapping of sections (``trainer: {lr: 1e-6}``): say so when its top level,
    or a section, is a list or a scalar (OmegaConf's own errors name neither the file nor the key)."""
    from omegaconf import DictConfig

    if not isinstance(layer, DictConfig):
        raise ConfigError(f"{noun} file {name}: the top level must be a mapping of sections (e.g. "
                          f"'trainer: {{lr: 1.0e-6}}'), not a {type(layer).__name__.replace('Config', '').lower()}")
    for key in layer:
        if key in schema and isinstance(schema[key], DictConfig) and not isinstance(layer[key], DictConfig):
            raise ConfigError(f"{noun} file {name}: '{key}' is a section; give it keys (e.g. '{key}: "
                              f"{{{next(iter(schema[key]), '...')}: ...}}'), not {layer[key]!r}")


def yaml_layer(path: str, schema, kind: ConfigKind):
    """The YAML file at ``path`` as one layer over ``schema``, its shape checked."""
    from omegaconf import OmegaConf

    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{kind.noun} file {path} is a directory; --file takes a YAML file")
    if not p.is_file():
        raise ConfigError(f"{kind.noun} file {path} does not exist")
    try:
        layer = OmegaConf.load(p)
    except Exception as e:  # yaml syntax
        if "Invalid loaded object type" in str(e):   # a scalar document
            raise ConfigError(f"{kind.noun} file {path}: the top level must be a mapping of sections (e.g. "
                              "'trainer: {lr: 1.0e-6}'), not a scalar") from None
        raise ConfigError(f"{kind.noun} file {path} is not valid YAML: {str(e).splitlines()[0]}") from None
    check_yaml_shape(path, layer, schema, kind.noun)
    kind.canonical_yaml(layer)
    return layer


def _unknown_key(key: str, valid: List[str], kind: ConfigKind) -> ConfigError:
    close = difflib.get_close_matches(str(key), valid, n=3)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    section = key.rsplit(".", 1)[0] + "." if "." in key else ""
    same = [k for k in valid if k.startswith(section)] if section else []
    more = f" Valid keys under {section[:-1]}: {same}" if same else f" Valid keys: {valid}"
    return ConfigError(f"unknown {kind.noun} key {key!r}{hint}{more}{kind.key_help}")


def _known(key: str, valid: List[str], kind: ConfigKind) -> bool:
    """A leaf key, a whole section or map entry (``stage2.prompted_critic=null``), or a key of an open map."""
    return (key in valid or any(v.startswith(key + ".") for v in valid)
            or any(key == m or key.startswith(m + ".") for m in kind.open_maps))


def _is_section(schema, key: str) -> bool:
    """``key`` names a section of the schema's dataclasses (not a leaf, nor an entry of a map, which
    an override may replace or drop: ``stage2.prompted_critic=null``)."""
    from omegaconf import DictConfig, OmegaConf

    parts, parent = key.split("."), schema
    try:
        for part in parts[:-1]:
            parent = parent._get_node(part)
        node = parent._get_node(parts[-1])
    except (AttributeError, KeyError, TypeError, ValueError):
        return False
    return isinstance(node, DictConfig) and dataclasses.is_dataclass(OmegaConf.get_type(parent))


def override_layer(overrides: Sequence[str], schema, valid: List[str], kind: ConfigKind):
    """The dotted overrides as one layer; an unknown key is refused before OmegaConf sees it."""
    from omegaconf import OmegaConf

    items = []
    for it in normalize_overrides(list(overrides)):
        key, value = it.split("=", 1)
        key = kind.canonical_key(key)
        if not _known(key, valid, kind):
            raise _unknown_key(key, valid, kind)
        if key not in valid and _is_section(schema, key):
            first = next(v for v in valid if v.startswith(key + "."))
            raise ConfigError(f"'{key}' is a section; set its keys (e.g. {first}=...), not {value!r}")
        items.append(f"{key}={empty_string(schema, key, value)}")
    return OmegaConf.from_dotlist(items)


def merge_layers(base, kind: ConfigKind, overrides: Optional[Sequence[str]] = None,
                 yaml_file: Optional[str] = None):
    """``base`` (a dataclass instance, or a dataclass for its defaults), then ``yaml_file``, then
    ``overrides``, merged into one OmegaConf node (interpolations kept) and checked by ``kind``."""
    from omegaconf import OmegaConf

    schema = OmegaConf.structured(base)
    layers = [yaml_layer(yaml_file, schema, kind)] if yaml_file else []
    valid = valid_keys(schema)
    try:
        with omegaconf_errors(kind.what):
            if overrides:
                if layers:
                    valid = valid_keys(OmegaConf.merge(schema, *layers))   # the file's own entries too
                layers.append(override_layer(overrides, schema, valid, kind))
            merged = OmegaConf.merge(schema, *layers)
            kind.check_merged(merged)
            return merged
    except UnknownKey as e:
        raise _unknown_key(e.key, valid, kind) from None


def build(merged, kind: ConfigKind):
    """The dataclasses of a merged node, every ``__post_init__`` check run."""
    from omegaconf import OmegaConf

    with omegaconf_errors(kind.what):
        return OmegaConf.to_object(merged)


def resolve_layers(base, kind: ConfigKind, overrides: Optional[Sequence[str]] = None,
                   yaml_file: Optional[str] = None):
    """:func:`merge_layers`, then :func:`build`: the config object."""
    return build(merge_layers(base, kind, overrides, yaml_file), kind)
