"""Reading checkpoint files without running code from them.

Run directories are shared on cluster filesystems and downloaded, and a manifest's sha256 is
recomputable by anyone: it says a file is intact, not who wrote it. A pickle runs whatever callable
it names while it loads, so no file of a checkpoint is unpickled with the full pickle machinery:

- ``rng_rank<r>.pt`` holds tensors, numbers and strings only (:func:`mopd.train.checkpoint.rng_state`)
  and is read with ``torch.load(weights_only=True)``; an RNG file of an earlier version (numpy's
  state as an array) loads through the same machinery with numpy's array classes allowed.
- DCP's ``.metadata`` is a pickle of its metadata dataclasses (protocol 4+, which torch's
  ``weights_only`` unpickler cannot read): :class:`MetadataUnpickler` builds only those classes,
  ``torch.Size``, dtypes, layouts and paths (:data:`METADATA_GLOBALS`), and refuses anything else
  before calling it. :class:`SafeFileSystemReader` reads it so, before torch's DCP reader sees it.
- DCP's non-tensor entries (the optimizer's hyperparameters) are read with ``weights_only=True``
  (:class:`SafeLoadPlanner`); its tensor shards already are.

A refused file is a :class:`UnsafeCheckpointFile`, one line naming the file and what it asked for.
"""

from __future__ import annotations

import inspect
import io
import pathlib
import pickle
from pathlib import Path

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
import torch.distributed.checkpoint.filesystem as dcp_fs
import torch.distributed.checkpoint.metadata as dcp_metadata
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner


class UnsafeCheckpointFile(pickle.UnpicklingError):
    """A checkpoint file holds a pickle that asks for something a checkpoint never holds."""


def _metadata_globals() -> dict[tuple[str, str], object]:
    allowed = {(dcp_metadata.__name__, name): cls for name, cls in inspect.getmembers(dcp_metadata, inspect.isclass)
               if cls.__module__ == dcp_metadata.__name__}
    allowed[(dcp_fs.__name__, "_StorageInfo")] = dcp_fs._StorageInfo
    allowed[("torch", "Size")] = torch.Size
    allowed[("torch.serialization", "_get_layout")] = torch.serialization._get_layout
    for cls in (pathlib.PosixPath, pathlib.PurePosixPath, pathlib.WindowsPath, pathlib.PureWindowsPath):
        allowed[("pathlib", cls.__name__)] = cls
    for name in dir(torch):
        if isinstance(getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format)):
            allowed[("torch", name)] = getattr(torch, name)
    return allowed


METADATA_GLOBALS = _metadata_globals()
"""What a DCP ``.metadata`` pickle may name: DCP's metadata dataclasses and enums, the storage
info of its file system writer, ``torch.Size``, dtypes, layouts, memory formats and paths. None of
them runs anything but its own constructor."""


class MetadataUnpickler(pickle.Unpickler):
    """An unpickler that builds only :data:`METADATA_GLOBALS` (the "restricting globals" recipe of
    Python's pickle documentation); anything else raises :class:`UnsafeCheckpointFile` unrun."""

    def find_class(self, module: str, name: str):
        found = METADATA_GLOBALS.get((module, name))
        if found is None:
            raise UnsafeCheckpointFile(f"it asks for {module}.{name}, which DCP metadata never holds")
        return found


def read_dcp_metadata(path: str | Path) -> dcp_metadata.Metadata:
    """The ``.metadata`` of the DCP checkpoint at ``path``, read by :class:`MetadataUnpickler`."""
    f = Path(path) / ".metadata"
    try:
        with open(f, "rb") as stream:
            meta = MetadataUnpickler(stream).load()
    except UnsafeCheckpointFile as e:
        raise UnsafeCheckpointFile(f"{f} is not DCP metadata this trainer wrote ({e}): refused, nothing in it "
                                   "was run") from None
    if not isinstance(meta, dcp_metadata.Metadata):
        raise UnsafeCheckpointFile(f"{f} holds a {type(meta).__name__}, not DCP metadata")
    return meta


class SafeFileSystemReader(dcp.FileSystemReader):
    """torch's DCP file reader with :func:`read_dcp_metadata` in place of its ``pickle.load``."""

    def read_metadata(self, *args, **kwargs) -> dcp_metadata.Metadata:
        rank = kwargs.get("rank")
        path = Path(self.path)
        if rank is not None:     # a per-rank metadata file (not written by this trainer)
            raise UnsafeCheckpointFile(f"{path}: per-rank DCP metadata is not read")
        metadata = read_dcp_metadata(path)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, reading non-tensor entries with ``weights_only=True``."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as e:
            raise UnsafeCheckpointFile(f"checkpoint entry {read_item.dest_index.fqn} is not plain data "
                                       f"({_why(e)}): refused, nothing in it was run") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def dcp_load(state: dict, path: str | Path) -> None:
    """``torch.distributed.checkpoint.load`` of ``state`` from ``path`` without unpickling code;
    a refused file is :class:`UnsafeCheckpointFile` (DCP wraps what its reader raises)."""
    try:
        dcp.load(state, storage_reader=SafeFileSystemReader(str(path)), planner=SafeLoadPlanner())
    except CheckpointException as e:
        for failure in e.failures.values():
            exc = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(exc, UnsafeCheckpointFile):
                raise UnsafeCheckpointFile(str(exc)) from None
        raise


def _why(e: BaseException) -> str:
    """The line of torch's weights-only refusal that names what the pickle asked for."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    named = next((line for line in lines if "Unsupported global" in line or "GLOBAL" in line), None)
    text = named or (lines[0] if lines else type(e).__name__)
    return text.removeprefix("WeightsUnpickler error: ")[:200]


def _legacy_rng_globals() -> list:
    """numpy's array classes, for RNG files written before the tensor format (numpy's state as an
    array): the array reconstructor builds only the classes allowed here."""
    core = getattr(np, "_core", None) or np.core
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def load_rng_file(f: str | Path) -> dict:
    """An ``rng_rank<r>.pt`` read with ``weights_only=True``; :class:`UnsafeCheckpointFile` if it
    holds anything but plain data."""
    try:
        with torch.serialization.safe_globals(_legacy_rng_globals()):
            state = torch.load(f, weights_only=True)
    except pickle.UnpicklingError as e:
        raise UnsafeCheckpointFile(f"{f} is not an RNG state this trainer wrote ({_why(e)}): refused, "
                                   "nothing in it was run") from None
    if not isinstance(state, dict) or not {"torch", "numpy", "python"} <= set(state):
        raise UnsafeCheckpointFile(f"{f} is not an RNG state this trainer wrote (no torch/numpy/python states)")
    return state
