"""``tensoropt calibrate --device``: time GEMMs, elementwise kernels and kernel launches on this
process's device (CUDA when visible, else the CPU) and write a measured device profile.

The fit (torch-free) is :func:`estimators.device_fit.measured_device_profile`; this module only
times. One process, no collectives: a single GPU is enough (NCCL's collectives stay priced from
the cluster profile; they need two GPUs).
"""

from __future__ import annotations

import datetime as _dt
import statistics
import subprocess
import time

GEMM_SIZES = (512, 1024, 2048, 4096, 8192)
"""Square GEMM sizes timed on a GPU (m = n = k)."""
TINY_GEMM_SIZES = (64, 128, 256)
"""Sizes timed with ``--tiny`` (the tests' CPU form)."""
BANDWIDTH_BYTES = 1 << 30
"""Bytes of each operand of the elementwise kernels on a GPU (1 GiB: far past the 50-60 MB L2)."""
TINY_BANDWIDTH_BYTES = 1 << 22
LAUNCH_CALLS = 2000


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_time_s(fn, device, repeats: int, min_total_s: float = 0.02) -> float:
    """Median seconds of one call of ``fn`` (after 3 warm-ups): each sample times enough calls to last
    ``min_total_s``, so a kernel of a few microseconds is not timed against the timer's resolution."""
    for _ in range(3):
        fn()
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    calls = max(1, int(min_total_s / max(time.perf_counter() - t0, 1e-7)))
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        _sync(device)
        samples.append((time.perf_counter() - t0) / calls)
    return statistics.median(samples)


def _bandwidth_rows(nbytes: int, device, repeats: int) -> list[dict]:
    import torch

    numel = nbytes // 4
    a, b = torch.rand(numel, device=device), torch.rand(numel, device=device)
    c = torch.empty(numel, device=device)
    return [
        {"kind": "add", "bytes": 3 * nbytes,
         "time_s": _median_time_s(lambda: torch.add(a, b, out=c), device, repeats)},
        {"kind": "copy", "bytes": 2 * nbytes, "time_s": _median_time_s(lambda: b.copy_(a), device, repeats)},
    ]


def device_description() -> dict:
    """The device this process computes on: kind, name, driver, torch and CUDA versions.

    Example:
        >>> device_description()["torch"] != ""
        True
    """
    import torch

    if not torch.cuda.is_available():
        return {"kind": "cpu", "name": "cpu", "driver": None, "torch": torch.__version__, "cuda": None}
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        driver = None
    props = torch.cuda.get_device_properties(0)
    return {"kind": "gpu", "name": torch.cuda.get_device_name(0), "driver": driver,
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "memory_bytes": int(props.total_memory), "multiprocessors": int(props.multi_processor_count)}


def measure_device(tiny: bool = False, repeats: int = 5) -> dict:
    """Time the kernels: ``{"gemms": [...], "bandwidth": [...], "kernel_launch_s": s, "device": {...}}``.

    GEMMs: bfloat16 and float32 (torch's default: no TF32) square products at :data:`GEMM_SIZES`.
    Bandwidth: ``c = a + b`` (3 operands' bytes) and ``b.copy_(a)`` (2) on float32 tensors of
    :data:`BANDWIDTH_BYTES` each. Launch: :data:`LAUNCH_CALLS` in-place adds on a one-element tensor,
    each depending on the last.

    Example:
        >>> m = measure_device(tiny=True, repeats=1)
        >>> sorted(m)
        ['bandwidth', 'device', 'gemms', 'kernel_launch_s']
    """
    import torch

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    gemms = []
    for dtype in (torch.bfloat16, torch.float32):
        for size in (TINY_GEMM_SIZES if tiny else GEMM_SIZES):
            a = torch.randn(size, size, device=device, dtype=dtype)
            b = torch.randn(size, size, device=device, dtype=dtype)
            out = torch.empty(size, size, device=device, dtype=dtype)
            seconds = _median_time_s(lambda a=a, b=b, out=out: torch.mm(a, b, out=out), device, repeats)
            gemms.append({"dtype": str(dtype).removeprefix("torch."), "m": size, "n": size, "k": size,
                          "time_s": seconds})
            del a, b, out
    bandwidth = _bandwidth_rows(TINY_BANDWIDTH_BYTES if tiny else BANDWIDTH_BYTES, device, repeats)
    x = torch.zeros(1, device=device)

    def chain():
        for _ in range(LAUNCH_CALLS):
            x.add_(1.0)

    launch_s = _median_time_s(chain, device, repeats, min_total_s=0.0) / LAUNCH_CALLS
    return {"gemms": gemms, "bandwidth": bandwidth, "kernel_launch_s": launch_s,
            "device": device_description()}


def base_device_name(description: dict) -> str:
    """The datasheet profile a measured device refines, from its name (H200 / H100 / A100 / CPU).

    Example:
        >>> base_device_name({"kind": "gpu", "name": "NVIDIA H200"}), base_device_name({"kind": "cpu"})
        ('h200-sxm-141gb', 'cpu')
    """
    if description.get("kind") != "gpu":
        return "cpu"
    name = str(description.get("name", "")).upper()
    for key, profile in (("H200", "h200-sxm-141gb"), ("H100", "h100-sxm-80gb"), ("A100", "a100-80gb"),
                         ("V100", "v100-32gb")):
        if key in name:
            return profile
    return "h100-sxm-80gb"


def measured_on(description: dict) -> str:
    """The citation of a measurement: device, driver, torch, date.

    Example:
        >>> measured_on({"name": "cpu", "torch": "2.13.0", "driver": None}).startswith("cpu (torch 2.13.0")
        True
    """
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    driver = f", driver {description['driver']}" if description.get("driver") else ""
    return f"{description.get('name')} (torch {description.get('torch')}{driver}, {stamp})"


def calibrate_device(base: str | None = None, tiny: bool = False) -> tuple[dict, dict]:
    """(measured profile mapping, the raw timings): :func:`measure_device` fitted by
    :func:`estimators.device_fit.measured_device_profile` over ``base`` (default: from the name).

    Example:
        >>> profile, timings = calibrate_device(tiny=True)
        >>> profile["name"]
        'cpu-measured'
    """
    from estimators.device_fit import measured_device_profile
    from estimators.profiles import load_device

    timings = measure_device(tiny=tiny)
    device = load_device(base or base_device_name(timings["device"]))
    profile = measured_device_profile(device, timings["gemms"], timings["bandwidth"],
                                      timings["kernel_launch_s"], measured_on(timings["device"]))
    return profile, timings
