"""Each rank's part of a batch: the same values at every world size, and nothing but its rows read."""

from __future__ import annotations

import pytest
import torch

from tensoropt.executor.job.data import BatchSource, DatasetRows, InputSpec, narrow, synthetic_batch

SPECS = [InputSpec((3,)), InputSpec((2,), "int64", high=7), InputSpec((), "bool")]


def test_ranks_rows_put_together_are_the_one_process_batch():
    whole = synthetic_batch(SPECS, 8, seed=3, step=5)
    source = BatchSource(SPECS, ("x", "ids", "mask"), 8, seed=3)
    parts = [source.local(5, [((lo, 4), (0, 3)), ((lo, 4), (0, 2)), ((lo, 4),)]) for lo in (0, 4)]
    for i, w in enumerate(whole):
        assert torch.equal(torch.cat([p[i] for p in parts]), w)
    assert not torch.equal(whole[0], synthetic_batch(SPECS, 8, seed=3, step=6)[0])  # a new batch per step
    assert int(whole[1].max()) < 7 and bool(whole[2].all())


def test_a_column_split_input_gets_its_columns_of_every_row():
    source = BatchSource(SPECS[:1], ("x",), 4, seed=0)
    (cols,) = source.local(1, [((0, 4), (1, 2))])
    assert torch.equal(cols, synthetic_batch(SPECS[:1], 4, 0, 1)[0][:, 1:3])


class Recording(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n, self.asked = n, []

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.asked.append(i)
        return {"x": torch.full((3,), float(i)), "targets": torch.tensor(i % 4)}


def test_a_dataset_is_read_only_at_the_rows_a_rank_holds():
    data = Recording(10)
    specs = [InputSpec((3,)), InputSpec((), "int64", 4)]
    source = BatchSource(specs, ("x", "targets"), 4, seed=0, dataset=data)
    x, y = source.local(2, [((2, 2), (0, 3)), ((2, 2),)])  # rank 1 of a 2-way batch split, step 2
    assert data.asked == [0, 1]  # rows 2, 3 of step 2 are samples 10, 11 -> wrapped to 0, 1
    assert x[:, 0].tolist() == [0.0, 1.0] and y.tolist() == [0, 1]
    data.asked.clear()
    source.local(0, [((0, 4), (0, 3)), ((2, 2),)])  # x replicated, targets split: the union of rows
    assert data.asked == [0, 1, 2, 3]


def test_a_sample_without_a_key_names_it():
    rows = DatasetRows([{"x": torch.ones(1)}], ("x", "targets"), 2)
    with pytest.raises(ValueError, match=r"a sample has no 'targets' \(it has \['x'\]\)"):
        rows.read(0, range(2))
    with pytest.raises(ValueError, match="not a map-style dataset"):
        DatasetRows(iter([]), ("x",), 2)


def test_narrow_takes_the_region_of_a_block_of_rows():
    t = torch.arange(20).reshape(5, 4)
    assert narrow(t, ((3, 2), (0, 4)), first_row=2).tolist() == [[4, 5, 6, 7], [8, 9, 10, 11]]
