"""Micro-batches of equal count on every rank, balanced by tokens within each rank.

FSDP2 ranks must run the same number of forward/backward passes (each pass is a chain of
collectives). Each rank rolls out its own questions, so the ranks' token totals differ; padding
the short ranks with empty micro-batches makes every one of those pay a full sharded forward and
backward for nothing, and leaves the remaining micro-batches as uneven as first-fit made them.

Instead: every rank finds how many micro-batches its own sequences need under the token budget
(first-fit decreasing), the ranks agree on the largest count (one all-reduce of one integer), and
every rank then deals its sequences into exactly that many micro-batches, longest first onto the
lightest (LPT). LPT's loads differ by at most the longest sequence, and when the count came from
a feasible first-fit packing it stays within the budget unless LPT's 4/3 bound bites, in which
case the first-fit packing is split instead. Empty micro-batches remain only where a rank has
fewer sequences than the agreed count.

Moving sequences between ranks would balance the ranks' totals too, but their advantages depend
on group statistics and scores computed where they were rolled out; that is not done here.
"""

from __future__ import annotations

from collections.abc import Sequence

from mopd.train.packing import pack_sequences, split_balanced


def micro_batch_count(lengths: Sequence[int], budget: int) -> int:
    """How many micro-batches first-fit decreasing needs for ``lengths`` under ``budget`` (0 if none)."""
    return len(pack_sequences(lengths, budget)) if lengths else 0


def deal_into(lengths: Sequence[int], budget: int, count: int) -> list[list[int]]:
    """Exactly ``count`` micro-batches (lists of sequence indices) of similar token loads.

    ``count`` must be at least ``micro_batch_count(lengths, budget)`` (the agreed maximum over
    ranks always is). A sequence longer than the budget still gets a micro-batch of its own.
    """
    if count < 1:
        raise ValueError(f"count={count} must be >= 1")
    need = micro_batch_count(lengths, budget)
    if count < need:
        raise ValueError(f"{len(lengths)} sequences need {need} micro-batches of {budget} tokens; got count={count}")
    bins: list[list[int]] = [[] for _ in range(count)]
    loads = [0] * count
    for i in sorted(range(len(lengths)), key=lambda k: (-lengths[k], k)):
        b = min(range(count), key=lambda k: (loads[k], k))
        bins[b].append(i)
        loads[b] += lengths[i]
    if all(load <= budget or len(items) == 1 for load, items in zip(loads, bins, strict=True)):
        return bins
    # LPT overshot the budget: keep first-fit's feasible bins and split the fullest until count.
    return _split_to_count(pack_sequences(lengths, budget), lengths, count)


def _split_to_count(bins: list[list[int]], lengths: Sequence[int], count: int) -> list[list[int]]:
    bins = [list(b) for b in bins]
    while len(bins) < count:
        splittable = [b for b in bins if len(b) > 1]
        if not splittable:
            bins.append([])
            continue
        fullest = max(splittable, key=lambda b: sum(lengths[i] for i in b))
        bins.remove(fullest)
        bins += list(split_balanced(fullest, lengths))
    return bins
