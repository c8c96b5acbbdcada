"""TRITON_INTERPRET must be set before triton is first imported, so that the Triton kernels run (slowly,
in numpy) on CPU and are compared with their torch references."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
