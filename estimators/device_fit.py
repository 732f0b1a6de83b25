"""A measured device profile from kernel timings (torch-free): GEMM efficiency per dtype, the memory
bandwidth elementwise kernels reach, and the per-kernel launch + dispatch floor.

``tensoropt calibrate --device`` times the kernels on the current device
(:mod:`tensoropt.commands.calibrate_device`); this module turns the timings into the three
constants the roofline prices every operator with (:func:`estimators.compute.roofline_time_s`):

* ``matmul_efficiency`` (and ``matmul_efficiency_by_dtype``): a GEMM of ``m x k`` by ``k x n`` does
  ``2 m n k`` FLOPs; its efficiency is ``2 m n k / time / peak(dtype)``. The constant is the median
  over the *large* GEMMs (every dimension >= :data:`LARGE_GEMM_DIM`, or the largest measured size
  where none is that large): the regime the constant describes. The small sizes are reported, not
  fitted: the roofline's launch floor prices them.
* ``memory_efficiency``: an elementwise kernel moving ``b`` bytes (reads + writes) in ``t`` reaches
  ``b / t``; the constant is the best such figure at the largest size over the datasheet bandwidth
  (capped at 1: on a CPU the caches can beat DRAM's figure).
* ``kernel_launch_s``: the time per call of a dependent chain of tiny kernels (one element each),
  i.e. what the host spends launching and dispatching one kernel when the device is never the
  bottleneck.

Example:
    >>> from estimators.profiles import load_device
    >>> base = load_device("h100-sxm-80gb")
    >>> gemms = [{"dtype": "bfloat16", "m": 4096, "n": 4096, "k": 4096, "time_s": 2 * 4096**3 / 6e14}]
    >>> prof = measured_device_profile(base, gemms, [{"kind": "add", "bytes": 3e9, "time_s": 1e-3}], 6e-6,
    ...                                "H100 test")
    >>> round(prof["matmul_efficiency"], 3), round(prof["memory_efficiency"], 3), prof["kernel_launch_s"]
    (0.606, 0.896, 6e-06)
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from estimators.profiles import Device

LARGE_GEMM_DIM = 2048
"""A GEMM whose every dimension is at least this large is in the compute-bound regime that
``matmul_efficiency`` describes (on an H100/H200 a 2048^3 bf16 GEMM is ~17 GFLOP: ~25 us)."""


def gemm_efficiency(row: dict, device: Device) -> float:
    """The fraction of ``row['dtype']``'s datasheet peak one timed GEMM reached.

    Example:
        >>> from estimators.profiles import load_device
        >>> gemm_efficiency({"dtype": "float32", "m": 10, "n": 10, "k": 10, "time_s": 2e3 / 67e12},
        ...                 load_device("h100-sxm-80gb"))
        1.0
    """
    flops = 2.0 * row["m"] * row["n"] * row["k"]
    return round(flops / row["time_s"] / device.peak_flops(row["dtype"]), 12)


def _large(rows: list[dict]) -> list[dict]:
    big = [r for r in rows if min(r["m"], r["n"], r["k"]) >= LARGE_GEMM_DIM]
    if big:
        return big
    top = max(min(r["m"], r["n"], r["k"]) for r in rows)
    return [r for r in rows if min(r["m"], r["n"], r["k"]) == top]


def measured_device_profile(
    base: Device,
    gemms: Sequence[dict],
    bandwidth: Sequence[dict],
    kernel_launch_s: float,
    measured_on: str,
) -> dict:
    """A device profile mapping (YAML-ready, :meth:`Device.from_dict`) with ``base``'s datasheet peaks
    and the three measured constants, each cited with what was measured.

    Args:
        base: the datasheet profile of the device measured (its peaks and memory are kept).
        gemms: ``{"dtype", "m", "n", "k", "time_s"}`` per timed GEMM size.
        bandwidth: ``{"kind", "bytes", "time_s"}`` per timed elementwise kernel (bytes read + written).
        kernel_launch_s: seconds per call of a chain of one-element kernels.
        measured_on: what and when (the GPU's name, driver, torch version, date), for the sources.

    Returns:
        The mapping; ``name`` is ``base.name + "-measured"``.

    Example:
        >>> from estimators.profiles import load_device
        >>> base = load_device("cpu")
        >>> rows = [{"dtype": "float32", "m": s, "n": s, "k": s, "time_s": 2 * s**3 / 5e10}
        ...         for s in (64, 128)]
        >>> prof = measured_device_profile(base, rows, [{"kind": "copy", "bytes": 1e8, "time_s": 1.0}],
        ...                                1e-5, "cpu test")
        >>> Device.from_dict(prof).name, sorted(prof["matmul_efficiency_by_dtype"])
        ('cpu-measured', ['float32'])
    """
    if not gemms or not bandwidth:
        raise ValueError("measured_device_profile: needs GEMM and bandwidth timings")
    by_dtype: dict[str, float] = {}
    why: dict[str, str] = {}
    for dtype in sorted({r["dtype"] for r in gemms}):
        rows = _large([r for r in gemms if r["dtype"] == dtype])
        effs = [gemm_efficiency(r, base) for r in rows]
        by_dtype[dtype] = min(1.0, statistics.median(effs))
        sizes = sorted({f"{r['m']}x{r['n']}x{r['k']}" for r in rows})
        why[dtype] = f"{dtype} {by_dtype[dtype]:.3f} (median of {', '.join(sizes)})"
    main_dtype = "bfloat16" if "bfloat16" in by_dtype else sorted(by_dtype)[0]
    largest = max(r["bytes"] for r in bandwidth)
    best = max((r for r in bandwidth if r["bytes"] == largest), key=lambda r: r["bytes"] / r["time_s"])
    achieved_gbps = best["bytes"] / best["time_s"] / 1e9
    memory_efficiency = min(1.0, achieved_gbps / base.memory_bandwidth_gbps)
    data = {
        "name": f"{base.name}-measured",
        "kind": base.kind,
        "description": f"{base.name} with GEMM efficiency, memory bandwidth and kernel launch measured "
                       f"on {measured_on}",
        "peak_tflops": dict(base.peak_tflops),
        "memory_bandwidth_gbps": base.memory_bandwidth_gbps,
        "memory_bytes": base.memory_bytes,
        "matmul_efficiency": by_dtype[main_dtype],
        "matmul_efficiency_by_dtype": by_dtype,
        "memory_efficiency": memory_efficiency,
        "kernel_launch_s": float(kernel_launch_s),
        "sources": {
            **{k: v for k, v in base.sources.items() if k in ("peak_tflops", "memory_bandwidth_gbps",
                                                              "memory_bytes")},
            "matmul_efficiency": f"tensoropt calibrate --device on {measured_on}: {why[main_dtype]}",
            "matmul_efficiency_by_dtype": f"tensoropt calibrate --device on {measured_on}: "
                                          + "; ".join(why[d] for d in sorted(why)),
            "memory_efficiency": f"tensoropt calibrate --device on {measured_on}: {best['kind']} of "
                                 f"{largest / 2**20:.0f} MiB (read + written) at {achieved_gbps:.0f} GB/s"
                                 f" against the datasheet's {base.memory_bandwidth_gbps:.0f}",
            "kernel_launch_s": f"tensoropt calibrate --device on {measured_on}: a chain of one-element "
                               f"kernels, {kernel_launch_s * 1e6:.2f} us per kernel",
        },
    }
    return data
