"""Test-wide settings. TRITON_INTERPRET must be set before triton is first imported, so that the
Triton kernels run (slowly, in numpy) on CPU and can be compared with their torch references."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
