"""Roofline compute time of one operator's local shard, forward and backward (torch-free).

    time = max(FLOPs / (peak(dtype) * efficiency), bytes / (bandwidth * memory_efficiency))
           + kernels * launch floor

* local FLOPs = the node's forward ``flops`` / product of the degrees of every split parallel
  dim (each split dim partitions the iteration space; a replicated operator computes it all);
* bytes = local operands + local parameters + local output (forward);
* backward of linear / conv2d / matmul: one forward-sized matmul per gradient it must produce
  (the weight gradient when it has parameters, one per operand that needs a gradient); of
  sdpa 2x forward (dQ, dK, dV and dP); of everything else one pass of forward FLOPs over 1.5x
  the bytes (read the output gradient and the saved tensor, write the input gradient);
* an operator that needs no gradient (no parameters, no operand on a parameter's path) has no
  backward;
* optimizer step: memory-bound over the local parameters, ``OPTIMIZER_PASSES`` parameter-sized
  reads+writes per element, at the device's ``optimizer_bandwidth_gbps`` for the fused Adam / AdamW
  kernel (else its memory bandwidth x efficiency), plus ``optimizer_tensor_s`` per parameter tensor
  (else ``kernel_launch_s``) (:func:`optimizer_time_s`).

Constants come from the device profile (``estimators.profiles.Device``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from estimators.memory import itemsize, numel
from estimators.profiles import Device

MATMUL_KINDS = frozenset({"linear", "matmul", "conv2d", "sdpa"})

OPTIMIZER_PASSES = {"sgd": 3, "momentum": 5, "adam": 7, "adamw": 7}
"""Parameter-sized memory passes of one optimizer step: sgd reads p, g and writes p; momentum adds
the buffer read + write; Adam/AdamW add both moments' read + write (torch.optim foreach kernels)."""

FUSED_OPTIMIZERS = frozenset({"adam", "adamw"})
"""Optimizers the executor steps with torch's fused kernel (one pass over all the streams of a tensor,
:mod:`tensoropt.executor.state.local_optim`): priced at the device's ``optimizer_bandwidth_gbps``."""


@dataclass(frozen=True)
class LocalOp:
    """The local shard of one operator under one configuration (what the roofline needs)."""

    kind: str
    dtype: str
    flops: float
    """Local forward FLOPs."""
    in_shapes: tuple[tuple[int, ...], ...]
    in_dtypes: tuple[str, ...]
    param_shapes: tuple[tuple[int, ...], ...]
    out_shape: tuple[int, ...]
    has_params: bool
    inputs_need_grad: tuple[bool, ...]
    variant: str = ""
    """How the executor runs it where that is not the captured op alone (empty: as captured):
    ``"sync_batch_norm"``, a batch-split training batch norm with synchronised statistics
    (:data:`estimators.batch_norm.SYNC_BATCH_NORM`); ``"channel_split_batch_norm"``, one whose
    channels are split (:data:`estimators.batch_norm.CHANNEL_SPLIT_BATCH_NORM`). A profiled timer that
    knows the variant times it so (its own cache key); the roofline ignores it."""


def op_bytes(op: LocalOp) -> int:
    """Forward bytes moved by the local shard: operands + parameters + output.

    Example:
        >>> op_bytes(LocalOp("elementwise", "float32", 8, ((8,),), ("float32",), (), (8,), False, (True,)))
        64
    """
    size = itemsize(op.dtype)
    total = sum(numel(s) * itemsize(d) for s, d in zip(op.in_shapes, op.in_dtypes))
    total += sum(numel(s) for s in op.param_shapes) * size
    return total + numel(op.out_shape) * size


def _roof(device: Device, flops: float, nbytes: float, matmul: bool, kernels: int,
          matmul_efficiency: float | None = None) -> float:
    eff = (device.matmul_efficiency if matmul_efficiency is None else matmul_efficiency) if matmul \
        else device.memory_efficiency
    flop_s = flops / (device.peak_flops("float32") * eff) if flops else 0.0
    byte_s = nbytes / (device.memory_bandwidth_gbps * 1e9 * device.memory_efficiency)
    return max(flop_s, byte_s) + kernels * device.kernel_launch_s


def roofline_time_s(device: Device, op: LocalOp) -> tuple[float, float]:
    """(forward, backward) roofline seconds of a local operator shard.

    Example:
        >>> from estimators.profiles import load_device
        >>> op = LocalOp("linear", "float32", 2 * 64 * 512 * 512, ((64, 512),), ("float32",),
        ...              ((512, 512),), (64, 512), True, (True,))
        >>> fwd, bwd = roofline_time_s(load_device("cpu"), op)
        >>> 1.9 < bwd / fwd < 2.1
        True
    """
    matmul = op.kind in MATMUL_KINDS
    peak_dtype_scale = device.peak_flops("float32") / device.peak_flops(op.dtype)
    flops = op.flops * peak_dtype_scale
    nbytes = op_bytes(op)
    eff = device.matmul_efficiency_for(op.dtype)
    fwd = _roof(device, flops, nbytes, matmul, 1, eff)
    grads = int(op.has_params) + sum(op.inputs_need_grad)
    if grads == 0:
        return fwd, 0.0
    if op.kind == "sdpa":
        bwd = _roof(device, 2 * flops, 2 * nbytes, True, 2, eff)
    elif matmul:
        bwd = _roof(device, grads * flops, grads * nbytes, True, grads, eff)
    else:
        bwd = _roof(device, flops, 1.5 * nbytes, False, 1)
    return fwd, bwd


def optimizer_time_s(device: Device, param_bytes: int, num_tensors: int, optimizer: str) -> float:
    """Seconds of one optimizer step over ``param_bytes`` local parameter bytes in ``num_tensors`` tensors:

        passes x param_bytes / bandwidth + num_tensors x per-tensor host time

    ``passes``: :data:`OPTIMIZER_PASSES`; ``bandwidth``: the device's ``optimizer_bandwidth_gbps`` for
    the fused Adam / AdamW kernel (:data:`FUSED_OPTIMIZERS`), else its memory bandwidth x memory
    efficiency; the per-tensor time: ``optimizer_tensor_s``, else ``kernel_launch_s``. On the cpu profile
    the two constants are fit (:func:`fit_optimizer_time`, ``benchmarks/optimizer_step.py``) to the
    optimizer's whole part of a step as ``tensoropt run``'s loop runs it
    (:mod:`tensoropt.training.optimizer_clock`: the gradients handed to the parameters,
    ``optimizer.step()`` with tensoropt's hooks, ``zero_grad``; optfit, 2026-11-28): 36 GB/s over the
    7 passes and 31 us a tensor, where the fused kernel alone (``step_local``) takes ~15 us a tensor.

    Example:
        >>> from estimators.profiles import load_device
        >>> optimizer_time_s(load_device("cpu"), 0, 0, "adamw")
        0.0
        >>> cpu = load_device("cpu")  # 4 MiB of AdamW in 2 tensors: 7 passes at the fused bandwidth
        >>> expected = 7 * 2**22 / (cpu.optimizer_bandwidth_gbps * 1e9) + 2 * cpu.optimizer_tensor_s
        >>> abs(optimizer_time_s(cpu, 2**22, 2, "adamw") - expected) < 1e-12
        True
    """
    if param_bytes <= 0:
        return 0.0
    name = optimizer.lower()
    passes = OPTIMIZER_PASSES.get(name, 7)
    bandwidth = device.memory_bandwidth_gbps * 1e9 * device.memory_efficiency
    if name in FUSED_OPTIMIZERS and device.optimizer_bandwidth_gbps:
        bandwidth = device.optimizer_bandwidth_gbps * 1e9
    per_tensor = device.optimizer_tensor_s or device.kernel_launch_s
    return passes * param_bytes / bandwidth + num_tensors * per_tensor


def fit_optimizer_time(param_bytes, num_tensors, times_s, optimizer: str = "adamw") -> tuple[float, float]:
    """Fit :func:`optimizer_time_s`' two constants to measured optimizer steps: ``(bandwidth_gbps,
    tensor_s)`` minimising the *relative* squared error of ``passes x param_bytes / bandwidth +
    num_tensors x tensor_s`` (each point weighs alike, large step or small), both kept >= 0.

    Args:
        param_bytes: each measured step's local parameter bytes.
        num_tensors: each step's parameter tensors.
        times_s: each step's measured seconds.
        optimizer: whose :data:`OPTIMIZER_PASSES` the bytes are multiplied by.

    Returns:
        ``(bandwidth_gbps, tensor_s)``; a bandwidth of ``inf`` where the bytes explain nothing.

    Example:
        >>> nbytes, tensors = [2**22, 2**20, 2**16], [8, 128, 64]
        >>> times = [7 * b / 40e9 + n * 1.5e-5 for b, n in zip(nbytes, tensors)]
        >>> gbps, per_tensor = fit_optimizer_time(nbytes, tensors, times)
        >>> round(gbps, 3), round(per_tensor * 1e6, 3)
        (40.0, 15.0)
    """
    passes = OPTIMIZER_PASSES.get(optimizer.lower(), 7)
    b = np.asarray(param_bytes, dtype=np.float64) * passes
    n = np.asarray(num_tensors, dtype=np.float64)
    t = np.asarray(times_s, dtype=np.float64)
    if not (b.shape == n.shape == t.shape) or len(t) < 2 or (t <= 0).any():
        raise ValueError("fit_optimizer_time: needs two or more steps, with positive times, and as many "
                         "byte counts and tensor counts as times")
    a = np.stack([b / t, n / t], axis=1)  # rows divided by the time: relative residuals
    (inv_bw, per_tensor), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    if inv_bw <= 0:  # the bytes explain nothing: tensors alone
        inv_bw, per_tensor = 0.0, float(np.sum(n / t) / np.sum((n / t) ** 2))
    elif per_tensor < 0:  # the tensor count explains nothing: bytes alone
        inv_bw, per_tensor = float(np.sum(b / t) / np.sum((b / t) ** 2)), 0.0
    return (float("inf") if inv_bw == 0 else float(1.0 / inv_bw / 1e9)), float(per_tensor)


def cast_time_s(device: Device, nbytes: int, num_tensors: int) -> float:
    """Seconds of memory-bound dtype casts moving ``nbytes`` (read + write) in ``num_tensors`` kernels.

    Mixed precision casts each parameter to the compute dtype in forward and its gradient back to
    float32 in backward (:func:`estimators.op_costs.node_cost`).

    Example:
        >>> from estimators.profiles import load_device
        >>> cast_time_s(load_device("cpu"), 0, 0)
        0.0
    """
    if nbytes <= 0:
        return 0.0
    bandwidth = device.memory_bandwidth_gbps * 1e9 * device.memory_efficiency
    return nbytes / bandwidth + num_tensors * device.kernel_launch_s
