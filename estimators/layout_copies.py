"""Local copies around a redistribution's collectives: what the replayed program copies beside them.

The collectives' fits (:mod:`estimators.collectives`) time gloo's and NCCL's dim-0 collectives on
contiguous buffers. DTensor, which the executor traces its redistributions through
(:mod:`tensoropt.executor.program.lowering`), lays a tensor out for them with local copies when
the shard is on another dim (``torch.distributed.tensor._collective_utils`` and
``placement_types.Shard``):

    all-gather to Replicate of S(d), d > 0:  the dim-0 gathered chunks are ``cat`` along d:
                                             a copy of the gathered bytes;
    reduce-scatter of P to S(d), d > 0:      the input is chunked along d and ``cat`` along 0 before
                                             the collective: a copy of the reduced bytes;
    S(i) -> S(j) (all-to-all):               gloo has none; DTensor all-gathers and chunks: a copy of
                                             the gathered bytes;
    R -> S(d), d > 0 (a local slice):        the chunk is made contiguous: a copy of the local shard.

The data-parallel gradient buckets (:class:`tensoropt.executor.state.gradsync.GradSync`, as the replayed
program traces them) are concatenated afresh before each bucket's all-reduce: every synchronised
gradient is copied once into its bucket (:func:`bucket_copy_time_s`; the reduced gradients are views
of the bucket, no copy back). Measured on the replayed steps' thread clock (``benchmarks/fidelity.py
--node-clock``, fidelity3): HF GPT-2's data-parallel ``aten::cat`` 1.21 ms a step for 8.15 MiB of
gradients (priced 0.87 ms), the ResNet's 1.97 ms for 17 MiB (priced 1.81 ms), priced nowhere before.

Each copy reads and writes its bytes once: ``2 * bytes / (memory bandwidth * memory efficiency)`` plus
one kernel launch (the device profile's ``memory_bandwidth_gbps``, measured with ``torch`` ``copy_``).
A dim-0 shard needs none of these (its chunks are contiguous). Measured on HF GPT-2 and BERT at width
256 (``benchmarks/fidelity.py --ops``): the model-parallel plans' ``aten::cat`` and ``aten::copy_``
self time, 28-79 ms a step at load 7, was priced nowhere before.
"""

from __future__ import annotations

from estimators.configuration import local_shape, shard_dim
from estimators.memory import numel
from estimators.profiles import Device
from estimators.redistribution import transition


def layout_copy_bytes(
    shape: tuple[int, ...], itemsize: int, src: tuple[str, ...], dst: tuple[str, ...],
    mesh_shape: tuple[int, ...],
) -> tuple[int, int]:
    """(bytes copied locally, copies) around the collectives that turn ``src`` into ``dst`` (one direction).

    Example:
        >>> layout_copy_bytes((8, 8), 4, ("S(1)",), ("R",), (2,))  # cat of the gathered 8 x 8
        (256, 1)
        >>> layout_copy_bytes((8, 8), 4, ("S(0)",), ("R",), (2,))  # dim-0 chunks: no copy
        (0, 0)
        >>> layout_copy_bytes((8, 8), 4, ("R",), ("S(1)",), (2,))  # the 8 x 4 slice made contiguous
        (128, 1)
    """
    total, copies = 0, 0
    cur = list(src)
    for axis in range(len(mesh_shape)):
        kind = transition(cur[axis], dst[axis])
        if kind is None:
            continue
        group = tuple(cur[:axis] + ["R"] + cur[axis + 1:])
        group_bytes = numel(local_shape(tuple(shape), group, tuple(mesh_shape))) * itemsize
        moved = 0
        if kind == "all_gather" and (shard_dim(cur[axis]) or 0) > 0:
            moved = group_bytes
        elif kind == "reduce_scatter" and (shard_dim(dst[axis]) or 0) > 0:
            moved = group_bytes
        elif kind == "all_to_all":
            moved = group_bytes
        elif kind == "slice" and dst[axis] not in ("R", "P") and (shard_dim(dst[axis]) or 0) > 0:
            moved = group_bytes // mesh_shape[axis]
        cur[axis] = dst[axis]
        if moved:
            total, copies = total + moved, copies + 1
    return total, copies


def layout_copy_time_s(
    device: Device, shape: tuple[int, ...], itemsize: int, src: tuple[str, ...], dst: tuple[str, ...],
    mesh_shape: tuple[int, ...],
) -> float:
    """Seconds of :func:`layout_copy_bytes`' copies: memory-bound, each byte read and written once.

    Example:
        >>> from estimators.profiles import load_device
        >>> t = layout_copy_time_s(load_device("cpu"), (1024, 1024), 4, ("S(1)",), ("R",), (2,))
        >>> round(t * 1e3, 3)  # 4 MiB read + written at 24.6 GB/s x 0.8, one launch
        0.431
    """
    nbytes, copies = layout_copy_bytes(tuple(shape), itemsize, tuple(src), tuple(dst), tuple(mesh_shape))
    if not nbytes:
        return 0.0
    bandwidth = device.memory_bandwidth_gbps * 1e9 * device.memory_efficiency
    return 2 * nbytes / bandwidth + copies * device.kernel_launch_s


def bucket_copy_time_s(device: Device, grad_bytes: float) -> float:
    """Seconds to copy ``grad_bytes`` of one synchronised gradient into its all-reduce bucket (read +
    write at the device's memory bandwidth x efficiency; the bucket's one launch is left out).

    Example:
        >>> from estimators.profiles import load_device
        >>> round(bucket_copy_time_s(load_device("cpu"), 8 * 2**20) * 1e3, 3)  # 8 MiB read + written
        0.853
    """
    if grad_bytes <= 0:
        return 0.0
    return 2 * grad_bytes / (device.memory_bandwidth_gbps * 1e9 * device.memory_efficiency)
