"""Peak tensor memory of a block of torch code, on CPU as on GPU, by a dispatch mode.

The CPU allocator keeps no statistics, and RSS mixes in the Python heap and the allocator's
caching, so the memory checks of the CPU path count tensors instead: every storage created by an
aten op inside the block (forward and backward, since a CPU backward runs in the calling thread)
is added when it first appears and subtracted when it is freed (a weakref finalizer on the
storage). Tensors that existed before the block are not counted, so ``peak_bytes`` is the *extra*
memory the block needed. ``largest_bytes`` is the biggest single allocation, which is how the
tests show that no ``[T, V]`` tensor was made.

This package's own custom ops (``linear_logprobs``) are opaque to a dispatch mode, so the tracker
runs their Python bodies itself, under the mode.

Not counted: scratch memory that a kernel allocates internally without returning it (e.g. a
BLAS workspace); both the naive and the chunked path have it, and it is small.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from mopd_kernels.ops import CUSTOM_OP_IMPLS


def _custom_op_impl(func):
    return CUSTOM_OP_IMPLS.get(getattr(func, "_schema", None) and func._schema.name)


class TensorMemoryTracker(TorchDispatchMode):
    """``with TensorMemoryTracker() as mem: ...`` then read ``mem.peak_bytes`` and ``mem.largest_bytes``."""

    def __init__(self):
        super().__init__()
        self.live_bytes = 0
        self.peak_bytes = 0
        self.largest_bytes = 0
        self.largest_shape = None
        self._live = {}
        self._outside = set()

    def _freed(self, key, nbytes):
        if self._live.pop(key, None) is not None:
            self.live_bytes -= nbytes

    def _forget(self, key):
        self._outside.discard(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # Storages that reach an op without having been made inside the block existed before it:
        # views of them, and in-place results on them, are not new memory.
        for t in tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key not in self._live and key not in self._outside and storage.nbytes() > 0:
                    self._outside.add(key)
                    weakref.finalize(storage, self._forget, key)
        impl = _custom_op_impl(func)
        if impl is not None:
            with self:  # an opaque custom op of this package: track the ops inside it
                out = impl(*args, **kwargs)
        else:
            out = func(*args, **kwargs)
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            nbytes = storage.nbytes()
            key = storage.data_ptr()
            if nbytes == 0 or key in self._live or key in self._outside:
                continue
            self._live[key] = nbytes
            self.live_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            if nbytes > self.largest_bytes:
                self.largest_bytes, self.largest_shape = nbytes, tuple(t.shape)
            weakref.finalize(storage, self._freed, key, nbytes)
        return out
