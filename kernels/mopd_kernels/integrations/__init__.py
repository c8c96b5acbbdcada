"""Adapters that put the fused loss into other trainers' own loops.

- ``mopd_kernels.integrations.trl``: ``FusedGRPOTrainer``, a ``trl.GRPOTrainer`` whose policy loss
  is the fused one (``pip install mopd-kernels[trl]``).
- ``mopd_kernels.integrations.verl``: ``install()``, which puts ``linear_logprobs`` into verl's
  fused-kernel forward and registers the fused loss's policy terms in verl's policy-loss registry
  (``pip install mopd-kernels[verl]``).

Each imports its trainer; nothing else in ``mopd_kernels`` does.
"""
