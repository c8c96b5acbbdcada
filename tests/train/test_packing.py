import random

import pytest

from mopd.train.packing import build_packed_batch, pack_sequences, padding_fraction


@pytest.mark.parametrize("world", [1, 2, 3])
def test_pack_sequences_budget_coverage_and_rank_balance(world):
    rng = random.Random(world)
    lengths = [rng.randint(1, 300) for _ in range(57)] + [900]   # one longer than the budget
    plan = pack_sequences(lengths, 512, world)
    assert len({len(p) for p in plan}) == 1                      # same micro-batch count per rank
    seen = sorted(i for rank in plan for mb in rank for i in mb)
    assert seen == list(range(len(lengths)))
    for rank in plan:
        for mb in rank:
            assert sum(lengths[i] for i in mb) <= 512 or mb == [57]
    loads = [sum(lengths[i] for mb in rank for i in mb) for rank in plan]
    assert max(loads) - min(loads) <= 900                        # no rank gets everything
    # first-fit-decreasing leaves bins nearly full: few micro-batches
    assert sum(len(r) for r in plan) <= sum(lengths) // 512 + 2 + world


def test_pack_fewer_sequences_than_ranks_gives_empty_micro_batches():
    plan = pack_sequences([5], 100, 3)
    assert [len(r) for r in plan] == [1, 1, 1] and sorted(map(len, (r[0] for r in plan))) == [0, 0, 1]
    b = build_packed_batch([], [], [], [])
    assert b.num_tokens == 1 and b.loss_tokens == 0


def test_build_packed_batch_shifts_signals_per_sequence():
    b = build_packed_batch([[10, 11, 12], [20, 21]], [[-1, 0, 0], [-1, 2]], [[0, .5, .5], [0, -1.]],
                           [[0, -.1, -.2], [0, -.3]], pad_to_multiple=8)
    assert b.input_ids.tolist() == [10, 11, 12, 20, 21, 0, 0, 0]
    assert b.position_ids.tolist() == [0, 1, 2, 0, 1, 0, 1, 2]
    assert b.targets.tolist()[:5] == [11, 12, 0, 21, 0]
    assert b.roles.tolist() == [0, 0, -1, 2, -1, -1, -1, -1]
    assert b.advantages.tolist()[:5] == [.5, .5, 0, -1, 0]
    assert b.sampling_logp.tolist()[:5] == pytest.approx([-.1, -.2, 0, -.3, 0])
    assert b.cu_seqlens.tolist() == [0, 3, 5, 8]
    assert padding_fraction([b]) == 3 / 8
    assert b.seq_ids.tolist() == [0, 0, 0, 1, 1, 2, 2, 2]  # the padding is a sequence of its own
    with pytest.raises(ValueError, match="sequence 0"):
        build_packed_batch([[1, 2]], [[0]], [[0, 0]], [[0, 0]])
