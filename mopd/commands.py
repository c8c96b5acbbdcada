"""`mopd config ...`: presets and resolved run configurations."""

from __future__ import annotations

from mopd.core.arguments import add_overrides_argument


def register(sub) -> None:
    p = sub.add_parser("config", help="show presets and resolved run configurations")
    csub = p.add_subparsers(dest="config_command", metavar="ACTION")
    show = csub.add_parser("show", help="print the resolved config of a preset with overrides")
    show.add_argument("preset", nargs="?", default=None,
                      help="preset name (see `mopd config list`); omitted: the plain defaults")
    show.add_argument("--file", dest="yaml_file", default=None,
                      help="YAML config applied on top of the preset, before the overrides (put it before PRESET)")
    add_overrides_argument(show)
    show.set_defaults(func=_show)
    ls = csub.add_parser("list", help="list the named presets")
    ls.set_defaults(func=_list)


def _show(args) -> int:
    from mopd.config import describe, resolve, to_yaml

    cfg = resolve(args.preset, args.overrides, args.yaml_file)
    print(describe(cfg))
    print("---")
    print(to_yaml(cfg), end="")
    return 0


def _list(args) -> int:
    import sys

    from mopd.config import PRESETS

    shown = set()
    for name, fn in PRESETS.held():   # the core's, before any recipe is imported (one may be slow)
        print(f"{name:26s} {(fn.__doc__ or '').strip()}")
        shown.add(name)
    sys.stdout.flush()
    for name, fn in PRESETS.items():   # then the recipes'
        if name not in shown:
            print(f"{name:26s} {(fn.__doc__ or '').strip()}")
    return 0
