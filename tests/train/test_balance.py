"""Equal micro-batch counts across ranks, token-balanced within each rank."""

import random

import pytest

from mopd.train.balance import deal_into, micro_batch_count
from mopd.train.packing import pack_sequences


def check_plan(bins, lengths, budget, count):
    assert len(bins) == count
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))      # each sequence once
    for b in bins:
        assert sum(lengths[i] for i in b) <= budget or len(b) == 1


@pytest.mark.parametrize("seed", range(6))
def test_every_rank_gets_the_agreed_count_balanced_and_within_budget(seed):
    rng = random.Random(seed)
    budget = rng.choice([700, 1000, 1600])
    ranks = [[rng.randint(20, 600) for _ in range(rng.randint(3, 40))] for _ in range(rng.randint(2, 5))]
    count = max(micro_batch_count(lengths, budget) for lengths in ranks)
    for lengths in ranks:
        bins = deal_into(lengths, budget, count)
        check_plan(bins, lengths, budget, count)
        loads = [sum(lengths[i] for i in b) for b in bins]
        if len(lengths) >= count:
            assert min(loads) > 0                          # no empty micro-batch to pay for
        # LPT: loads differ by at most the longest sequence (or first-fit was kept for the budget)
        assert max(loads) - min(loads) <= max(lengths) or max(loads) <= budget


def test_more_balanced_than_padding_first_fit_with_empty_micro_batches():
    rng = random.Random(7)
    short = [rng.randint(50, 400) for _ in range(12)]
    budget, count = 1000, 6
    bins = deal_into(short, budget, count)
    loads = sorted(sum(short[i] for i in b) for b in bins)
    ffd = sorted(sum(short[i] for i in b) for b in pack_sequences(short, budget))
    assert len(ffd) < count                                 # padding would add empty passes
    assert loads[0] > 0 and loads[-1] < ffd[-1]             # the heaviest pass got lighter


def test_overlong_sequences_and_too_few_sequences():
    assert [len(b) for b in deal_into([5000, 10, 10], 100, 2)] in ([1, 2], [2, 1])
    bins = deal_into([30, 40], 100, 4)
    check_plan(bins, [30, 40], 100, 4)
    assert sum(1 for b in bins if not b) == 2
    with pytest.raises(ValueError, match="need"):
        deal_into([90, 90, 90], 100, 2)


def test_lpt_overshoot_falls_back_to_first_fit_splits():
    lengths = [60, 50, 50, 40]                  # LPT into 2 bins: [60,40] [50,50] = 100,100 fits
    check_plan(deal_into(lengths, 100, 2), lengths, 100, 2)
    lengths = [5, 5, 4, 3, 3, 3, 3, 2, 2]       # total 30 into 3 bins of 10: first-fit fits, LPT may not
    check_plan(deal_into(lengths, 10, 3), lengths, 10, 3)
