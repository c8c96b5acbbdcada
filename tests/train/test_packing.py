import random

import pytest

from mopd.train.packing import build_packed_batch, pack_sequences, padding_fraction, split_balanced


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_pack_sequences_budget_and_coverage(seed):
    rng = random.Random(seed)
    lengths = [rng.randint(1, 300) for _ in range(57)] + [900]   # one longer than the budget
    bins = pack_sequences(lengths, 512)
    assert sorted(i for mb in bins for i in mb) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in mb) <= 512 or mb == [57] for mb in bins)
    # first-fit-decreasing leaves bins nearly full: few micro-batches
    assert len(bins) <= sum(lengths) // 512 + 2
    with pytest.raises(ValueError):
        pack_sequences(lengths, 0)


def test_split_balanced_halves_the_load():
    lengths = [300, 10, 200, 90, 50, 49, 1]
    a, b = split_balanced(range(len(lengths)), lengths)
    assert sorted(a + b) == list(range(len(lengths)))
    assert abs(sum(lengths[i] for i in a) - sum(lengths[i] for i in b)) <= max(lengths)


def test_an_empty_micro_batch_is_one_untrained_pad():
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
