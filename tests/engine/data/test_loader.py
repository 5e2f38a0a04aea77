import pytest

from engine.data import DataError, PromptLoader, PromptSample


def samples(n):
    return [
        PromptSample(
            index=i,
            prompt_ids=[i],
            messages=[],
            data_source="s",
            ground_truth=str(i),
            ability="",
            extra_info={},
        )
        for i in range(n)
    ]


def ids(batch):
    return [s.index for s in batch]


def epoch_batches(loader):
    return [ids(b) for b in loader]


def test_len_and_drop_last():
    data = samples(10)
    assert len(PromptLoader(data, 3, shuffle=False, seed=0)) == 3
    assert len(PromptLoader(data, 3, shuffle=False, seed=0, drop_last=False)) == 4
    assert epoch_batches(PromptLoader(data, 3, shuffle=False, seed=0)) == [
        [0, 1, 2],
        [3, 4, 5],
        [6, 7, 8],
    ]
    assert epoch_batches(PromptLoader(data, 3, shuffle=False, seed=0, drop_last=False))[-1] == [9]


def test_batch_size_errors():
    with pytest.raises(DataError, match="batch size 11 is larger than the dataset"):
        PromptLoader(samples(10), 11, shuffle=True, seed=0)
    with pytest.raises(DataError, match="positive"):
        PromptLoader(samples(10), 0, shuffle=True, seed=0)


def test_deterministic_per_seed():
    def run(seed):
        loader = PromptLoader(samples(20), 4, shuffle=True, seed=seed)
        return [epoch_batches(loader) for _ in range(3)]

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_each_epoch_is_a_new_permutation_without_repeats():
    loader = PromptLoader(samples(24), 4, shuffle=True, seed=7)
    epochs = []
    for expected_epoch in range(3):
        assert loader.epoch == expected_epoch
        flat = [i for batch in epoch_batches(loader) for i in batch]
        assert sorted(flat) == list(range(24))  # every sample once, none repeated
        epochs.append(flat)
    assert loader.epoch == 3
    assert epochs[0] != epochs[1] != epochs[2]
    assert epochs[0] != list(range(24))  # shuffled


def test_drop_last_never_repeats_within_an_epoch():
    loader = PromptLoader(samples(10), 3, shuffle=True, seed=0)
    flat = [i for batch in epoch_batches(loader) for i in batch]
    assert len(flat) == 9 and len(set(flat)) == 9


def test_break_and_continue_keeps_the_position():
    whole = epoch_batches(PromptLoader(samples(12), 3, shuffle=True, seed=3))
    loader = PromptLoader(samples(12), 3, shuffle=True, seed=3)
    got = []
    for batch in loader:
        got.append(ids(batch))
        break
    got += epoch_batches(loader)
    assert got == whole


def uninterrupted(n, batch_size, seed, epochs, drop_last=True):
    loader = PromptLoader(samples(n), batch_size, shuffle=True, seed=seed, drop_last=drop_last)
    return [ids(b) for _ in range(epochs) for b in loader]


def resumed(n, batch_size, seed, epochs, k, drop_last=True):
    """Take k batches, checkpoint, then finish with a fresh loader restored from the state."""
    first = PromptLoader(samples(n), batch_size, shuffle=True, seed=seed, drop_last=drop_last)
    got = []
    while len(got) < k:
        for batch in first:
            got.append(ids(batch))
            if len(got) == k:
                break
    state = first.state_dict()
    second = PromptLoader(samples(n), batch_size, shuffle=True, seed=seed, drop_last=drop_last)
    second.load_state_dict(state)
    while second.epoch < epochs:
        got += [ids(b) for b in second]
    return got


@pytest.mark.parametrize("drop_last", [True, False])
def test_resume_gives_exactly_the_uninterrupted_batches(drop_last):
    n, bs, seed, epochs = 10, 3, 5, 3
    per_epoch = 3 if drop_last else 4
    expected = uninterrupted(n, bs, seed, epochs, drop_last)
    assert len(expected) == per_epoch * epochs
    # Every cut point: mid-epoch, exactly at an epoch's end, and in later epochs.
    for k in range(1, per_epoch * epochs):
        assert resumed(n, bs, seed, epochs, k, drop_last) == expected, k


def test_state_at_the_end_of_an_epoch_points_to_the_next():
    loader = PromptLoader(samples(6), 3, shuffle=True, seed=0)
    it = iter(loader)
    next(it)
    assert loader.state_dict()["epoch"] == 0 and loader.state_dict()["batches_done"] == 1
    next(it)
    assert loader.epoch == 0  # still in epoch 0 while its last batch is used
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["batches_done"] == 0


def test_load_state_rejects_changed_settings():
    state = PromptLoader(samples(10), 2, shuffle=True, seed=1).state_dict()
    with pytest.raises(DataError, match=r"seed 1 -> 2"):
        PromptLoader(samples(10), 2, shuffle=True, seed=2).load_state_dict(state)
    with pytest.raises(DataError, match=r"num_samples 10 -> 12"):
        PromptLoader(samples(12), 2, shuffle=True, seed=1).load_state_dict(state)


def test_no_shuffle_is_in_order_every_epoch():
    loader = PromptLoader(samples(4), 2, shuffle=False, seed=0)
    assert epoch_batches(loader) == [[0, 1], [2, 3]]
    assert epoch_batches(loader) == [[0, 1], [2, 3]]
