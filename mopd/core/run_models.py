"""The models of one run: the base, the policy's adapters, and whether each frozen model is a view
of that base or a model of its own. Built once from the config, before any weight loads.

Every part that needs to know "does this run train LoRA adapters?" or "is the teacher a copy?"
asks a :class:`RunModels` (pre-start checks, run identity, the memory plan and the pipeline's
footprint, frozen-model loading, checkpoints, exports, the engine's adapter slot); nothing else
reads ``cfg.model.lora`` (``tests/test_layering.py`` checks it). Building one reads file headers
only (config.json, the adapters' files, sampled weight blocks for the fingerprint); the structure
of the base (its module names, to check ``model.lora.target_modules``) is built on the meta device.

**The one rule for a frozen model** (the teacher, the KL reference), by its configured path:

- an adapter directory (PEFT's format, :mod:`mopd.core.adapter_dir`), or a path the caller says an
  adapter will be written to (a pipeline's Stage-I adapter before Stage I ran): with LoRA a *view*
  of the policy's base with that adapter active, after checking that the adapter was trained over
  these base weights; without LoRA a *copy*: its base loaded with the adapter merged;
- the base itself (the same directory, or other files with the same weights' fingerprint), or no
  path yet (a preset before ``teacher.path`` is set): with LoRA a *view* with no adapter active;
- anything else: a *copy*, loaded as its own model.

A path that does not exist yet and is not a Hub id is, with LoRA, planned as the adapter
``mopd train --export-adapter`` will write there (``mopd plan`` before Stage I ran); the pre-start
checks refuse it before a run loads anything.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

from mopd.core.adapter_dir import (AdapterDir, AdapterDirError, check_adapter_files, is_adapter_dir,
                                   read_adapter_dir, resolve_base_dir)
from mopd.core.errors import UserError
from mopd.core.fingerprint import model_fingerprint

ALL_LINEAR = "all-linear"

VIEW_BASE = "base view"
"""The policy's base with no adapter active (LoRA)."""
VIEW_ADAPTER = "adapter view"
"""The policy's base with a frozen adapter of its own active (LoRA)."""
COPY = "copy"
"""A model of its own, loaded beside the policy."""
MERGED_COPY = "merged copy"
"""An adapter directory loaded as its base with the adapter merged (a run without LoRA)."""


class RunModelsError(UserError):
    """A run's models do not fit together (the message names the setting): one line."""


@dataclass(frozen=True)
class Adapters:
    """The policy's trainable LoRA adapters (``model.lora`` with rank > 0)."""

    rank: int
    alpha: float
    dropout: float
    target_modules: Tuple[str, ...]
    """As configured: module names (the last component, as PEFT matches them) or ``all-linear``."""

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def peft_targets(self):
        """PEFT's ``target_modules``: ``"all-linear"`` or a list of names."""
        return ALL_LINEAR if self.target_modules == (ALL_LINEAR,) else list(self.target_modules)

    def record(self) -> dict:
        """What a checkpoint and run.json keep (plain JSON values)."""
        return {"rank": self.rank, "alpha": self.alpha, "dropout": self.dropout,
                "target_modules": list(self.target_modules)}

    @staticmethod
    def of(settings) -> "Adapters":
        """``settings`` (``model.lora``, a :class:`mopd.config.inputs.LoraConfig`, or Adapters) as Adapters."""
        if isinstance(settings, Adapters):
            return settings
        return Adapters(int(settings.rank), float(settings.alpha), float(settings.dropout),
                        tuple(settings.target_modules))

    @staticmethod
    def from_record(d) -> Optional["Adapters"]:
        """The adapters a checkpoint recorded (None: full fine-tuning, or nothing recorded)."""
        if not isinstance(d, dict) or not d.get("rank"):
            return None
        targets = d.get("target_modules") or ()
        targets = (targets,) if isinstance(targets, str) else tuple(targets)
        return Adapters(int(d["rank"]), float(d.get("alpha", d["rank"])), float(d.get("dropout", 0.0)), targets)

    @staticmethod
    def of_adapter_dir(adapter: AdapterDir) -> "Adapters":
        """The settings of a saved adapter (PEFT's ``adapter_config.json``)."""
        c = adapter.config
        targets = c.get("target_modules") or ()
        targets = (targets,) if isinstance(targets, str) else tuple(sorted(targets))
        return Adapters(int(c["r"]), float(c.get("lora_alpha", c["r"])), 0.0, targets)


@dataclass(frozen=True)
class FrozenModel:
    """The teacher or the KL reference of a run, and how it is held."""

    role: str
    """``teacher`` or ``reference``."""
    path: str
    """As configured (empty: the base itself, a preset before ``teacher.path`` is set)."""
    kind: str
    """:data:`VIEW_BASE`, :data:`VIEW_ADAPTER`, :data:`COPY` or :data:`MERGED_COPY`."""
    adapter_name: Optional[str] = None
    """For an adapter view: the name its adapter is attached under (one per directory)."""
    planned: bool = False
    """An adapter that does not exist yet (planned: a pipeline's dry run, ``mopd plan``)."""

    @property
    def is_view(self) -> bool:
        return self.kind in (VIEW_BASE, VIEW_ADAPTER)

    @property
    def key(self) -> str:
        """The same directory gives the same key (a teacher that is also the reference loads once)."""
        return _key(self.path) if self.path else ""


@dataclass(frozen=True)
class RunModels:
    """The base, the policy's adapters and the frozen models of one run (see the module docstring)."""

    base: str
    """``model.path`` as configured: a local directory or a Hub id."""
    adapters: Optional[Adapters]
    """None: full fine-tuning (every weight trains)."""
    frozen: Tuple[FrozenModel, ...]
    """The teacher and the reference the config needs, in that order (either may be absent)."""

    # ------------------------------------------------------------------ building
    @staticmethod
    def from_config(cfg, *, planned_adapters: Iterable[str] = ()) -> "RunModels":
        """The models of a training config (:class:`mopd.config.Config`). ``planned_adapters``:
        paths the caller knows an adapter will be written to (a pipeline's Stage-I adapter)."""
        adapters = Adapters.of(cfg.model.lora) if cfg.model.lora.rank > 0 else None
        planned = {_key(p) for p in planned_adapters if p}
        models = RunModels(cfg.model.path, adapters, ())
        wanted = []
        if cfg.opd_roles():
            wanted.append(("teacher", cfg.teacher.path or ""))
        if cfg.reference_roles():
            wanted.append(("reference", cfg.reference_path() or ""))
        frozen: List[FrozenModel] = []
        names: Dict[str, str] = {}
        for role, path in wanted:
            kind, is_planned = models._kind_of(path, planned)
            name = None
            if kind == VIEW_ADAPTER:
                name = names.setdefault(_key(path), role)
            frozen.append(FrozenModel(role, path, kind, name, is_planned))
        return RunModels(cfg.model.path, adapters, tuple(frozen))

    def _kind_of(self, path: str, planned: set) -> Tuple[str, bool]:
        """The one rule (module docstring): ``(kind, planned)`` of a frozen model at ``path``."""
        lora = self.adapters is not None
        if not path:
            return (VIEW_BASE if lora else COPY), False
        if is_adapter_dir(path):
            return (VIEW_ADAPTER if lora else MERGED_COPY), False
        if _key(path) in planned or (lora and _unwritten_local(path)):
            return (VIEW_ADAPTER if lora else MERGED_COPY), True
        if lora and self.is_base(path):
            return VIEW_BASE, False
        return COPY, False

    # ------------------------------------------------------------------ what the run trains
    @property
    def trains_adapters(self) -> bool:
        return self.adapters is not None

    @property
    def lora_rank(self) -> int:
        """The adapters' rank, 0 in full fine-tuning (an engine's adapter slot)."""
        return self.adapters.rank if self.adapters else 0

    @property
    def checkpoint_holds(self) -> str:
        return "LoRA adapters only" if self.adapters else "all weights (full fine-tuning)"

    def record(self) -> Optional[dict]:
        """The adapters as a checkpoint keeps them (None: full fine-tuning)."""
        return self.adapters.record() if self.adapters else None

    # ------------------------------------------------------------------ the base
    @cached_property
    def base_fingerprint(self) -> dict:
        """:func:`mopd.core.fingerprint.model_fingerprint` of the base (a Hub id through the local
        Hugging Face cache when it is there)."""
        local = resolve_base_dir(self.base)
        fp = model_fingerprint(local) if local else model_fingerprint(self.base)
        if local and not Path(self.base).expanduser().is_dir():   # a Hub id: recorded as the id
            fp = {**fp, "path": self.base}
        return fp

    @property
    def base_weights(self) -> Optional[str]:
        return self.base_fingerprint.get("weights")

    @property
    def base_record(self) -> dict:
        """What an adapter records of its base (``mopd_base.json``): the resolved directory (a Hub id
        as the id) and its weights' fingerprint."""
        return {"path": self.base_fingerprint["path"], "weights": self.base_weights}

    def is_base(self, path: str) -> bool:
        """Whether ``path`` is this run's base: the same directory, or the same weights elsewhere."""
        if not path or _key(path) == _key(self.base):
            return True
        if is_adapter_dir(path) or not Path(path).expanduser().is_dir():
            return False
        mine = self.base_weights
        return mine is not None and model_fingerprint(path)["weights"] == mine

    # ------------------------------------------------------------------ the frozen models
    def frozen_model(self, role: str) -> Optional[FrozenModel]:
        return next((f for f in self.frozen if f.role == role), None)

    @property
    def teacher(self) -> Optional[FrozenModel]:
        return self.frozen_model("teacher")

    @property
    def reference(self) -> Optional[FrozenModel]:
        return self.frozen_model("reference")

    def distinct(self) -> List[FrozenModel]:
        """The frozen models, one per directory (a teacher that is also the reference once)."""
        seen, out = set(), []
        for f in self.frozen:
            k = f.key or self.base
            if k not in seen:
                seen.add(k)
                out.append(f)
        return out

    def views(self) -> List[FrozenModel]:
        return [f for f in self.distinct() if f.is_view]

    def copies(self) -> List[FrozenModel]:
        return [f for f in self.distinct() if not f.is_view]

    def adapter_views(self) -> List[FrozenModel]:
        """The frozen adapters to attach to the policy (one per directory)."""
        return [f for f in self.views() if f.kind == VIEW_ADAPTER]

    # ------------------------------------------------------------------ checks before anything loads
    def check(self) -> None:
        """Every adapter view's directory reads, fits its config and was trained over this base;
        the policy's adapters fit the base's modules. One line (RunModelsError) otherwise."""
        for f in self.adapter_views():
            if not f.planned:
                self.check_adapter_view(f)
        if self.adapters is not None:
            self.check_targets()

    def check_adapter_view(self, f: FrozenModel) -> AdapterDir:
        try:
            adapter = read_adapter_dir(f.path)
            check_adapter_files(adapter)
        except AdapterDirError as e:
            raise RunModelsError(f"{f.role}.path: {e}") from None
        need, have = adapter.base_weights, self.base_weights
        if need and have and need != have:
            raise RunModelsError(f"{f.role}.path={f.path} is an adapter over another base model (weights "
                                 f"{need[:12]}, model.path {self.base} has {have[:12]}): give the base it was "
                                 "trained on, or a merged export (`mopd export RUN` without --adapter)")
        return adapter

    def check_targets(self) -> None:
        """``model.lora.target_modules`` against the base's real modules (built on the meta device
        from its config.json; a Hub id not in the local cache is checked when it loads)."""
        structure = base_structure(self.base)
        if structure is not None:
            check_targets(self.adapters, structure)


# ---------------------------------------------------------------------- the base's modules
@dataclass(frozen=True)
class ModelStructure:
    """What LoRA needs to know of a model before it loads: its linear and embedding modules."""

    linear: Dict[str, Tuple[int, int]]
    """Full module name -> (in_features, out_features) of every linear layer."""
    embeddings: Tuple[str, ...]
    """Full names of the embedding modules."""
    tied: bool
    """Whether the input embedding and the lm head share one weight."""


def base_structure(path: str) -> Optional[ModelStructure]:
    """The modules of the model at ``path`` (a directory, or a Hub id in the local cache), built on
    the meta device from its config.json (nothing is allocated); None where there is no config."""
    local = resolve_base_dir(path)
    if local is None or not (local / "config.json").is_file():
        return None
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from mopd.core.model_dir import remote_code_trusted

    try:
        config = AutoConfig.from_pretrained(str(local), trust_remote_code=remote_code_trusted())
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=remote_code_trusted())
    except Exception:   # the loader says it better when the model loads
        return None
    return structure_of(model)


def structure_of(model) -> ModelStructure:
    """The linear and embedding modules of a built model (on any device, the meta one included)."""
    import torch

    linear = {n: (m.in_features, m.out_features) for n, m in model.named_modules()
              if isinstance(m, torch.nn.Linear)}
    embeddings = tuple(n for n, m in model.named_modules() if isinstance(m, torch.nn.Embedding))
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    tied = bool(getattr(config, "tie_word_embeddings", False)) or bool(getattr(text, "tie_word_embeddings", False))
    return ModelStructure(linear, embeddings, tied)


def check_targets(adapters: Adapters, structure: ModelStructure) -> None:
    """One line (RunModelsError) for target modules the model does not have, an adapted tied
    embedding, or a rank over a targeted layer's width."""
    targets = adapters.target_modules
    if targets == (ALL_LINEAR,):
        chosen = {n: io for n, io in structure.linear.items() if _leaf(n) != "lm_head"}
    else:
        leaves = sorted({_leaf(n) for n in structure.linear} | {_leaf(n) for n in structure.embeddings})
        missing = [t for t in targets if t not in leaves]
        if missing:
            hints = "; ".join(f"{t} matches no module of the model (closest: "
                              f"{', '.join(difflib.get_close_matches(t, leaves, 3, 0.5)) or 'none'})" for t in missing)
            raise RunModelsError(f"model.lora.target_modules={','.join(targets)}: {hints}; its modules are "
                                 f"{', '.join(leaves)}")
        tied_embeds = [t for t in targets if any(_leaf(n) == t for n in structure.embeddings)]
        if tied_embeds and structure.tied:
            raise RunModelsError(f"model.lora.target_modules: {tied_embeds[0]} is tied to the lm head (one shared "
                                 "weight), which the fused loss head reads unadapted: an adapter there would "
                                 "train a different model than its merged export; leave it out")
        chosen = {n: io for n, io in structure.linear.items() if _leaf(n) in targets}
    narrow = [(n, min(io)) for n, io in chosen.items() if min(io) < adapters.rank]
    if narrow:
        name, width = min(narrow, key=lambda x: x[1])
        raise RunModelsError(f"model.lora.rank={adapters.rank} is over the width of {name} ({width}): a LoRA "
                             f"rank must be at most the smaller side of every adapted layer; use "
                             f"model.lora.rank<={width}")


def _leaf(name: str) -> str:
    return name.rpartition(".")[2]


def _key(path: str) -> str:
    return os.path.realpath(os.path.expanduser(path))


def _unwritten_local(path: str) -> bool:
    """A local path (not a Hub id ``org/name``) that is not there yet."""
    return not Path(path).expanduser().exists() and (path.startswith(("/", ".", "~")) or path.count("/") >= 2)


__all__ = ["ALL_LINEAR", "Adapters", "COPY", "FrozenModel", "MERGED_COPY", "ModelStructure", "RunModels",
           "RunModelsError", "VIEW_ADAPTER", "VIEW_BASE", "base_structure", "check_targets", "structure_of"]
