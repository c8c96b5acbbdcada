"""The roles of the team: one table every package reads its role list from.

A role's id is its position in :data:`ROLES`; packed batches carry it per token and the fused
loss reads ``role_specs[id]``.
"""

from __future__ import annotations

from typing import Dict

ROLES = ("leader", "searcher", "answerer")
"""Role names in role-id order."""

ROLE_IDS: Dict[str, int] = {r: i for i, r in enumerate(ROLES)}
"""Role name -> the role id carried by each token of a packed batch."""
