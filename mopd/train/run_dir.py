"""A run directory knows which run it holds, so two runs are never mixed in one.

The first start writes ``<out_dir>/run.json``: the resolved config (flattened to dotted keys, the
engine ``rollout.engine`` among them), fingerprints of the model, the teacher and the data
(resolved path plus a sampled hash of the weights or the file, :mod:`mopd.core.fingerprint`) and
the retriever (kind, resolved index directory or URL, and the index's fingerprint, a server's as
it reports it: :func:`mopd.retriever.identity.retriever_identity`). Then:

- a start without ``--resume`` refuses a directory that already holds a run (``run.json``,
  checkpoints, metrics or events); ``--overwrite`` moves that run's files aside to
  ``<out_dir>.replaced-<time>/`` first;
- ``--resume`` compares the new identity with the recorded one and refuses any difference, listing
  each as ``key: old -> new``; ``--allow-changed KEY ...`` accepts deliberate ones (a key, or a
  section such as ``trainer``), and they are recorded in ``run.json``'s ``changes``. Keys that
  cannot change what is trained (logging, the directory itself) are never compared.

A directory with checkpoints but no ``run.json`` (written before run files existed) is compared
through its ``config.yaml`` alone.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from mopd.config import identity_dict
from mopd.core.atomic import atomic_write_text
from mopd.core.fingerprint import data_fingerprint, model_fingerprint
from mopd.retriever import IndexDirError, NoRetriever, RetrieverUnavailable, retriever_identity

RUN_FILE = "run.json"
RUN_ENTRIES = ("run.json", "config.yaml", "metrics.jsonl", "events.jsonl", "checkpoints", "training.png", "tb",
               "wandb")
"""What a training run writes into its directory (what ``--overwrite`` moves aside)."""
NEVER_COMPARED = ("description", "trainer.out_dir", "trainer.tensorboard", "trainer.wandb_project", "trainer.cpu_threads",
                  "trainer.log_every", "retriever.token_file")
DEFAULT_OUT_DIR = "runs/default"


class RunDirError(ValueError):
    """The run directory holds another run, or a resume would change what the run is."""


@dataclass
class RunStart:
    """What :func:`prepare_run_dir` did: lines for events.jsonl, where an old run went."""

    events: list = field(default_factory=list)
    moved_to: Path | None = None
    changes: dict = field(default_factory=dict)


def flatten(d: dict, prefix: str = "") -> dict:
    """``{"a": {"b": 1}} -> {"a.b": 1}`` (lists are kept as values)."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def run_identity(cfg) -> dict:
    """The resolved config and the fingerprints that say what this run trains."""
    conf = flatten(identity_dict(cfg))
    ident = {"config": conf, "model": model_fingerprint(cfg.model.path)}
    teacher = conf.get("teacher.path") or ""
    ident["teacher"] = model_fingerprint(teacher) if teacher else None
    reference = conf.get("reference.path") or ""
    ident["reference"] = model_fingerprint(reference) if reference else None
    ident["data"] = {"train": data_fingerprint(conf.get("data.train") or ""),
                     "dev": data_fingerprint(conf.get("data.dev") or "")}
    ident["retriever"] = retriever_record(cfg.retriever)
    return ident


def retriever_record(cfg) -> dict:
    """The retriever's identity (:func:`mopd.retriever.identity.retriever_identity`); one that cannot
    be read (no retriever, no index there, a server that does not answer: what preflight refuses
    before a run starts) is recorded with ``fingerprint: None``."""
    try:
        return retriever_identity(cfg)
    except (NoRetriever, IndexDirError, RetrieverUnavailable, OSError):
        where = {"url": cfg.url} if cfg.kind == "http" else {"index": cfg.index}
        return {"kind": cfg.kind, **where, "fingerprint": None}


def _as_recorded(value):
    """A setting as run.json holds it (JSON's values): a tuple given now and the list it was
    recorded as compare equal, for every list-valued setting."""
    return json.loads(json.dumps(value, default=str))


def _comparable(ident: dict) -> dict:
    """One flat dict of everything compared on resume."""
    out = {k: _as_recorded(v) for k, v in ident.get("config", {}).items() if k not in NEVER_COMPARED}
    if not out.get("model.lora.rank"):   # LoRA off (or a run from before it existed): its settings say nothing
        out = {k: v for k, v in out.items() if not k.startswith("model.lora.")}
    if out.get("reward.kl_type", "k1") == "k1":   # k1, what a run from before the setting used
        out.pop("reward.kl_type", None)
    for name in ("model", "teacher", "reference"):
        fp = ident.get(name)
        if fp:
            out[f"{name}.resolved_path"] = fp.get("path")
            out[f"{name}.weights"] = fp.get("weights")
            if "chat_template" in fp:   # absent from older runs' run.json; every prompt is rendered with it
                out[f"{name}.chat_template"] = fp["chat_template"]
    for split, fp in (ident.get("data") or {}).items():
        if fp:
            out[f"data.{split}.resolved_path"] = fp.get("path")
            out[f"data.{split}.content"] = fp.get("content")
    retriever = ident.get("retriever")
    if retriever:
        out["retriever.resolved_index" if "index" in retriever else "retriever.resolved_url"] = \
            retriever.get("index", retriever.get("url"))
        out["retriever.fingerprint"] = retriever.get("fingerprint")
    return out


def _allowed(key: str, allow: Iterable[str]) -> bool:
    return any(key == a or key.startswith(a + ".") for a in allow)


def identity_differences(old: dict, new: dict, allow: Sequence[str] = (), config_only: bool = False
                         ) -> tuple[dict, dict]:
    """``(refused, accepted)``: ``{key: (old, new)}`` of every compared key that differs, split by
    whether ``allow`` names it (a key or a section prefix). ``config_only``: ``old`` is a run from
    before run.json, of which only the config is known."""
    a, b = _comparable(old), _comparable(new)
    if config_only:
        b = {k: v for k, v in b.items() if k in a}
    elif "retriever" not in old:   # a run recorded before run.json held the retriever: its config only
        b = {k: v for k, v in b.items() if k in a or k not in _comparable({"retriever": new.get("retriever")})}
    # A run recorded before its models' chat templates were: compared on what it recorded.
    b = {k: v for k, v in b.items() if k in a or not k.endswith(".chat_template")}
    diff = {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
    refused = {k: v for k, v in diff.items() if not _allowed(k, allow)}
    return refused, {k: v for k, v in diff.items() if k not in refused}


def _short(v) -> str:
    s = json.dumps(v) if not isinstance(v, str) else v
    return s if len(s) <= 60 else s[:28] + "..." + s[-28:]


IDENTITY_FIRST = ("method", "model.", "teacher.", "reference.", "data.", "retriever.")


def describe(diff: dict, most: int = 12) -> str:
    """``key: old -> new; ...``, what names the run (method, model, teacher, data, retriever) first."""
    keys = sorted(diff, key=lambda k: (not k.startswith(IDENTITY_FIRST), k))
    text = "; ".join(f"{k}: {_short(diff[k][0])} -> {_short(diff[k][1])}" for k in keys[:most])
    return text + (f"; and {len(keys) - most} more ({', '.join(keys[most:])})" if len(keys) > most else "")


def present_entries(out_dir: Path) -> list:
    """The run files found in ``out_dir`` (empty files and empty checkpoint folders do not count)."""
    found = []
    for name in RUN_ENTRIES:
        p = out_dir / name
        if p.is_file() and p.stat().st_size > 0:
            found.append(name)
        elif p.is_dir() and any(p.iterdir()):
            found.append(name + "/")
    return found


def recorded_identity(out_dir: Path) -> dict | None:
    """``run.json``'s identity, or for an older run a config-only identity from ``config.yaml``."""
    f = out_dir / RUN_FILE
    if f.is_file():
        try:
            return json.loads(f.read_text(encoding="utf-8"))
        except ValueError as e:
            raise RunDirError(f"{f} is not valid JSON ({e}); move it away to start afresh") from None
    y = out_dir / "config.yaml"
    if y.is_file():
        try:
            conf = OmegaConf.to_container(OmegaConf.load(y))
        except Exception as e:  # noqa: BLE001 (yaml or omegaconf errors: say so, do not compare with nothing)
            raise RunDirError(f"{y} cannot be read ({type(e).__name__}); move it away to start afresh") from None
        if isinstance(conf, dict):
            return {"legacy": True, "config_only": flatten(conf)}
    return None


def move_aside(out_dir: Path, now: float | None = None) -> Path:
    """Move the run files of ``out_dir`` into a new sibling ``<out_dir>.replaced-<time>[-n]``."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
    dest = out_dir.with_name(f"{out_dir.name}.replaced-{stamp}")
    n = 1
    while dest.exists():
        dest = out_dir.with_name(f"{out_dir.name}.replaced-{stamp}-{n}")
        n += 1
    dest.mkdir(parents=True)
    for name in RUN_ENTRIES:
        if (out_dir / name).exists():
            shutil.move(str(out_dir / name), str(dest / name))
    return dest


WANDB_KEY = "wandb"
"""run.json's entry for the run's W&B run: ``{"id": ..., "project": ...}``. Kept by ``--resume``, so
that the resumed run logs into the same W&B run; a fresh start (or ``--overwrite``) has none."""


def write_identity(out_dir: Path, ident: dict, changes: list | None = None, wandb: dict | None = None) -> None:
    """run.json: the identity, the accepted changes and (a resumed run's) W&B run (:func:`wandb_run`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    data = dict(ident, changes=changes or [])
    if wandb:
        data[WANDB_KEY] = wandb
    atomic_write_text(out_dir / RUN_FILE, json.dumps(data, indent=1, default=str))


def wandb_run(out_dir: Path) -> dict | None:
    """The W&B run recorded in ``out_dir/run.json`` (``{"id", "project"}``), or None."""
    f = Path(out_dir) / RUN_FILE
    try:
        entry = json.loads(f.read_text(encoding="utf-8")).get(WANDB_KEY) if f.is_file() else None
    except (ValueError, AttributeError):
        return None
    return entry if isinstance(entry, dict) and isinstance(entry.get("id"), str) and entry["id"] else None


def record_wandb_run(out_dir: Path, run_id: str, project: str) -> bool:
    """Keep the W&B run's id in ``out_dir/run.json`` (rewritten whole); returns whether it could (a
    directory without run.json, a run not started by ``mopd train``, has nowhere to keep it)."""
    f = Path(out_dir) / RUN_FILE
    if not f.is_file():
        return False
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except ValueError:
        return False
    if not isinstance(data, dict):
        return False
    data[WANDB_KEY] = {"id": run_id, "project": project}
    atomic_write_text(f, json.dumps(data, indent=1, default=str))
    return True


def prepare_run_dir(cfg, *, resume: bool, overwrite: bool = False, allow_changed: Sequence[str] = (),
                    now: float | None = None) -> RunStart:
    """Check ``cfg.trainer.out_dir`` against this start and record the run (rank 0 only).

    Raises :class:`RunDirError` (one line) when the directory holds another run."""
    out_dir = Path(cfg.trainer.out_dir)
    start = RunStart()
    ident = run_identity(cfg)
    if resume and overwrite:
        raise RunDirError("--resume continues the run in trainer.out_dir and --overwrite replaces it: choose one")
    found = present_entries(out_dir) if out_dir.is_dir() else []
    if not resume:
        if found and not overwrite:
            raise RunDirError(f"{out_dir} already holds a run ({', '.join(found)}): continue it with --resume, "
                              "replace it with --overwrite (the old run is moved aside), or set another "
                              "trainer.out_dir")
        if found:
            start.moved_to = move_aside(out_dir, now)
            start.events.append(f"--overwrite: the previous run in {out_dir} was moved to {start.moved_to}")
        write_identity(out_dir, ident)
        return start
    old = recorded_identity(out_dir) if found else None
    history: list = []
    if old is not None:
        legacy = bool(old.get("legacy"))
        old_ident = {"config": old["config_only"]} if legacy else old
        refused, accepted = identity_differences(old_ident, ident, allow_changed, config_only=legacy)
        if refused:
            raise RunDirError(f"--resume would change the run in {out_dir}: {describe(refused)}. Resume with the "
                              "run's own settings, accept deliberate changes with --allow-changed KEY..., or "
                              "start a new trainer.out_dir")
        history = list(old.get("changes", []))
        if accepted:
            start.changes = accepted
            history.append({"time": now if now is not None else time.time(),
                            "changed": {k: list(v) for k, v in accepted.items()}})
            start.events.append(f"--allow-changed: {describe(accepted)}")
        if old.get("legacy"):
            start.events.append(f"{out_dir} had no {RUN_FILE}; compared with its config.yaml and recorded it")
    write_identity(out_dir, ident, history, wandb=(old or {}).get(WANDB_KEY))
    return start


UNSTARTED = {"run.json", "config.yaml", "events.jsonl"}


def discard_unstarted(out_dir: Path) -> bool:
    """Remove what a fresh start wrote if it failed before training (no metrics, no checkpoints),
    so the next start is not refused as "holds a run"; returns whether it did."""
    found = set(present_entries(out_dir)) if out_dir.is_dir() else set()
    if not found or not found <= UNSTARTED:
        return False
    for name in found:
        (out_dir / name).unlink(missing_ok=True)
    return True


def default_out_dir(cfg, preset: str | None) -> bool:
    """Give a run left at the generic ``runs/default`` the preset's name (``runs/<preset>``);
    returns whether it did."""
    if preset and cfg.trainer.out_dir == DEFAULT_OUT_DIR:
        cfg.trainer.out_dir = f"runs/{preset}"
        return True
    return False


def truncate_metrics(path: Path, step: int | None) -> int:
    """Drop ``metrics.jsonl`` lines of steps after ``step`` (all of them for ``None``: a resume with
    no checkpoint starts again at step 0); returns how many were dropped. Lines that are not JSON
    (a kill mid-write) are dropped too."""
    if not path.is_file():
        return 0
    keep, dropped = [], 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            ok = step is not None and int(json.loads(line).get("step", 0)) <= step
        except (ValueError, TypeError, AttributeError):
            ok = False
        if ok:
            keep.append(line)
        else:
            dropped += bool(line.strip())
    atomic_write_text(path, "".join(x + "\n" for x in keep))
    return dropped
