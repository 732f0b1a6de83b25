"""Training data: each rank produces only its part of each step's global batch.

The global batch of a step is the same for every rank count (so a plan at 4 processes trains on
exactly the samples the 1-process run trains on), but no rank builds it: :class:`BatchSource`
gives each rank the region of every input its layout holds (:func:`input_regions`: the rows of
its batch shard, all rows where the plan replicates the batch).

Sources, by what the job gives:

- synthetic (``model.inputs``/``targets``, or a zoo model's task): every sample row is drawn from
  its own generator, seeded by (seed, step, input, row) (:func:`synthetic_rows`), so a rank draws
  its rows without drawing the others';
- ``data: {factory, kwargs}``: a map-style ``torch.utils.data.Dataset`` of samples keyed like the
  inputs (and ``targets``); row ``r`` of step ``s`` is sample ``(s * global_batch_size + r) % len``,
  and a rank reads only the samples of its rows (:class:`DatasetRows`);
- ``--dataset module:function`` (``f(step, global_batch_size, seed)`` returns the global batch):
  the older form; it makes the whole batch and each rank keeps its region;
- a model's ``example_inputs(batch_size)`` (a contract model without ``model.inputs``): called for
  the global batch under a seed per step; each rank keeps its region.

The count of valid labels a batch-split cross entropy divides by is then not at hand on any rank:
the interpreter all-reduces it (one small collective per loss, launched as forward starts).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from estimators.dtypes import torch_dtypes
from tensoropt.models.registry import load_factory  # noqa: F401 - the one factory loader, re-exported

_DTYPES = torch_dtypes()
"""Input dtype names -> torch dtypes (the one table: :data:`estimators.dtypes.DTYPE_BYTES`)."""

Region = tuple[tuple[int, int], ...]
"""Per dim of one input's global shape: (offset, length) of what this rank holds."""


@dataclass(frozen=True)
class InputSpec:
    """One model input, per sample.

    Attributes:
        shape: per-sample shape (the batch dim is prepended).
        dtype: ``"float32"``, ``"int64"``, ``"bool"``, ...
        high: for integer inputs, values are drawn from ``[0, high)`` (classes, vocabulary).
        from_model: the values come from the model's ``example_inputs(batch_size)``, not drawn
            here (``high`` may then be empty).
    """

    shape: tuple[int, ...]
    dtype: str = "float32"
    high: int | None = None
    from_model: bool = False

    def __post_init__(self):
        if self.dtype not in _DTYPES:
            raise ValueError(f"InputSpec.dtype: unknown dtype {self.dtype!r}; expected one of "
                             f"{sorted(_DTYPES)}")
        if self.dtype.startswith("int") and not self.high and not self.from_model:
            raise ValueError(f"InputSpec.high: integer input of shape {self.shape} needs a positive 'high'")

    @staticmethod
    def from_json(data: dict) -> InputSpec:
        """From ``{"shape": [...], "dtype": ..., "high": ..., "from_model": ...}``.

        Example:
            >>> InputSpec.from_json({"shape": [4], "dtype": "int64", "high": 9})
            InputSpec(shape=(4,), dtype='int64', high=9, from_model=False)
        """
        return InputSpec(tuple(int(s) for s in data["shape"]), data.get("dtype", "float32"), data.get("high"),
                         bool(data.get("from_model", False)))


def _row_seed(seed: int, step: int, which: int, row: int) -> int:
    """The generator seed of one sample row of one input (distinct for every (step, input, row))."""
    return ((seed * 1_000_003 + step) * 1_009 + which) * 1_000_000_007 + row & 0x7FFF_FFFF_FFFF_FFFF


def synthetic_rows(specs: Sequence[InputSpec], seed: int, step: int, rows: Sequence[range]) -> tuple:
    """Rows ``rows[i]`` of input ``i`` of the synthetic global batch of ``step``.

    Each row has its own generator, so the values of a row do not depend on which other rows are
    drawn: a rank draws only its rows and gets exactly what the 1-process run gets there. Floats
    are standard normal, integers uniform in ``[0, high)``, booleans True (an attention mask).

    Example:
        >>> specs = [InputSpec((3,)), InputSpec((), "int64", high=5)]
        >>> x, y = synthetic_rows(specs, seed=0, step=7, rows=[range(0, 4), range(2, 4)])
        >>> x.shape, y.shape, bool((x[2:] == synthetic_rows(specs, 0, 7, [range(2, 4)] * 2)[0]).all())
        (torch.Size([4, 3]), torch.Size([2]), True)
    """
    out = []
    for which, (spec, wanted) in enumerate(zip(specs, rows)):
        dtype = _DTYPES[spec.dtype]
        if dtype == torch.bool:
            out.append(torch.ones((len(wanted), *spec.shape), dtype=dtype))
            continue
        parts = []
        for row in wanted:
            gen = torch.Generator().manual_seed(_row_seed(seed, step, which, row))
            if dtype.is_floating_point:
                parts.append(torch.randn(spec.shape, generator=gen).to(dtype))
            else:
                parts.append(torch.randint(0, spec.high, spec.shape, generator=gen, dtype=dtype))
        out.append(torch.stack(parts) if parts else torch.empty((0, *spec.shape), dtype=dtype))
    return tuple(out)


def synthetic_batch(specs: list[InputSpec], global_batch_size: int, seed: int, step: int) -> tuple:
    """The whole synthetic global batch of ``step`` (every row; :func:`synthetic_rows` draws some).

    Example:
        >>> specs = [InputSpec((3,)), InputSpec((), "int64", high=5)]
        >>> x, y = synthetic_batch(specs, 4, seed=0, step=7)
        >>> x.shape, y.shape, bool((synthetic_batch(specs, 4, 0, 7)[0] == x).all())
        (torch.Size([4, 3]), torch.Size([4]), True)
    """
    return synthetic_rows(specs, seed, step, [range(global_batch_size)] * len(specs))


class DatasetRows:
    """Reads rows of each step's global batch from a map-style dataset (``data.factory``).

    Row ``r`` of step ``s`` is sample ``(s * global_batch_size + r) % len(dataset)`` (in dataset
    order: shuffle inside the dataset if the order should be random). Each sample is a mapping
    with a key per name (the forward's inputs, then ``targets``); values are stacked into batches.

    Example:
        >>> ds = [{"x": torch.tensor([float(i)]), "targets": torch.tensor(i)} for i in range(5)]
        >>> rows = DatasetRows(ds, ("x", "targets"), global_batch_size=4)
        >>> x, y = rows.read(step=1, rows=range(1, 3))
        >>> y.tolist()
        [0, 1]
    """

    def __init__(self, dataset, names: Sequence[str], global_batch_size: int, source: str = "data.factory"):
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise ValueError(f"{source} returned {type(dataset).__name__}, not a map-style dataset "
                             "(a torch.utils.data.Dataset with __len__ and __getitem__)")
        if len(dataset) == 0:
            raise ValueError(f"{source} returned an empty dataset")
        self.dataset, self.names, self.batch, self.source = dataset, tuple(names), global_batch_size, source

    def index(self, step: int, row: int) -> int:
        """The dataset index of row ``row`` of step ``step``'s global batch."""
        return (step * self.batch + row) % len(self.dataset)

    def read(self, step: int, rows: range) -> tuple[torch.Tensor, ...]:
        """The samples of ``rows``, stacked per name."""
        samples = [self.dataset[self.index(step, r)] for r in rows]
        out = []
        for name in self.names:
            try:
                out.append(torch.stack([torch.as_tensor(s[name]) for s in samples]))
            except (KeyError, TypeError, IndexError):
                first = samples[0] if samples else None
                keys = list(first) if hasattr(first, "keys") else type(first).__name__
                raise ValueError(f"{self.source}: a sample has no {name!r} (it has {keys}); each sample must "
                                 f"be a mapping with the keys {list(self.names)}") from None
        return tuple(out)


def input_regions(global_shapes: Sequence[tuple[int, ...]], mesh, placements: Sequence) -> list[Region]:
    """The region of each input that this rank holds under its placements (all of it without a mesh).

    Example:
        >>> input_regions([(4, 3)], None, [None])
        [((0, 4), (0, 3))]
    """
    if mesh is None:
        return [tuple((0, n) for n in shape) for shape in global_shapes]
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    out = []
    for shape, placement in zip(global_shapes, placements):
        local, offset = compute_local_shape_and_global_offset(tuple(shape), mesh, placement)
        out.append(tuple(zip((int(o) for o in offset), (int(n) for n in local))))
    return out


def narrow(t: torch.Tensor, region: Region, first_row: int = 0) -> torch.Tensor:
    """The part of ``t`` (whose first row is global row ``first_row``) that ``region`` names.

    Example:
        >>> narrow(torch.arange(12).reshape(4, 3), ((2, 2), (1, 2)), first_row=1).tolist()
        [[4, 5], [7, 8]]
    """
    for dim, (offset, length) in enumerate(region):
        start = offset - first_row if dim == 0 else offset
        if start != 0 or length != t.shape[dim]:
            t = t.narrow(dim, start, length)
    return t.contiguous()


class BatchSource:
    """Produces this rank's region of every input of each step (see the module docstring).

    Args:
        specs: per-sample specs of the graph's inputs, in order (``InputSpec``).
        names: their names (keys of dataset samples).
        global_batch_size: rows per step over all ranks.
        seed: the job's seed.
        dataset: a map-style dataset (``data.factory``'s), or None.
        batch_fn: the older ``f(step, global_batch_size, seed)`` returning the global batch, or None.
        example_fn: ``example_inputs(batch_size)`` of the model, for the ``from_model`` specs.

    Example:
        >>> src = BatchSource([InputSpec((2,)), InputSpec((), "int64", 3)], ("x", "targets"), 4, seed=0)
        >>> [tuple(t.shape) for t in src.local(0, [((2, 2), (0, 2)), ((0, 4),)])]
        [(2, 2), (4,)]
    """

    def __init__(self, specs: Sequence[InputSpec], names: Sequence[str], global_batch_size: int, seed: int,
                 dataset=None, batch_fn: Callable | None = None, example_fn: Callable | None = None):
        self.specs, self.names = tuple(specs), tuple(names)
        self.batch, self.seed = global_batch_size, seed
        self.rows = DatasetRows(dataset, names, global_batch_size) if dataset is not None else None
        self.batch_fn, self.example_fn = batch_fn, example_fn

    def local(self, step: int, regions: Sequence[Region]) -> tuple[torch.Tensor, ...]:
        """This rank's region of each input of ``step``'s global batch.

        Example:
            >>> BatchSource([InputSpec((2,))], ("x",), 4, 0).local(3, [((0, 4), (1, 1))])[0].shape
            torch.Size([4, 1])
        """
        regions = list(regions)
        if self.batch_fn is not None:  # the older global-batch factory: slice what this rank holds
            batch = self.batch_fn(step, self.batch, self.seed)
            return tuple(narrow(t, r) for t, r in zip(batch, regions))
        wanted = [range(r[0][0], r[0][0] + r[0][1]) if r else range(0) for r in regions]
        if self.rows is not None:
            first = min(w.start for w in wanted)
            stop = max(w.stop for w in wanted)
            batch = self.rows.read(step, range(first, stop))
            return tuple(narrow(t, r, first) for t, r in zip(batch, regions))
        drawn = synthetic_rows(self.specs, self.seed, step, wanted)
        out = [narrow(t, r, w.start) for t, r, w in zip(drawn, regions, wanted)]
        if any(s.from_model for s in self.specs):
            examples = self._examples(step)
            out = [narrow(examples[i], r) if s.from_model else t
                   for i, (s, t, r) in enumerate(zip(self.specs, out, regions))]
        return tuple(out)

    def _examples(self, step: int) -> tuple[torch.Tensor, ...]:
        """The model's ``example_inputs`` for the global batch, drawn under a seed per step."""
        if self.example_fn is None:
            raise ValueError("model.inputs: the inputs come from the model's example_inputs, "
                             "but no model was given to draw them")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed * 1_000_003 + step)
            return tuple(t.cpu() for t in self.example_fn(self.batch))
