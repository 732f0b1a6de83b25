"""Device and cluster profiles: the hardware constants the cost model uses (torch-free).

A profile is a YAML file under ``configs/devices/`` or ``configs/clusters/`` (loadable by
name, e.g. ``load_cluster("h100x8")``), a path to such a file, or an inline dict. Every
numeric constant must be cited: each file has a ``sources`` mapping from the constant's key
(dotted for nested keys, e.g. ``inter_node.bandwidth_gbps``) to the datasheet, paper or
calibration it comes from. A missing or malformed constant raises :class:`ProfileError`
naming the file and the key.

Units: bandwidths in GB/s (1e9 bytes per second, one direction, per device), latencies in
seconds, memory in bytes, compute in TFLOP/s (1e12 floating-point operations per second).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from estimators.profile_files import CONFIGS_ENV, ProfileError, _find, _read_yaml, _Reader, configs_dirs

__all__ = [
    "CONFIGS_ENV",
    "COLLECTIVES",
    "Cluster",
    "CollectiveFit",
    "Device",
    "Link",
    "ProfileError",
    "cluster_to_dict",
    "configs_dirs",
    "load_cluster",
    "load_device",
]

OVERHEAD_KEYS: tuple[str, ...] = ("op_overhead_local_s", "op_overhead_dtensor_s", "redistribute_overhead_s")
"""Device keys of the executor's host overhead (:mod:`estimators.overhead`)."""

COLLECTIVES: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


@dataclass(frozen=True)
class Device:
    """One accelerator (or CPU) model.

    Example:
        >>> d = load_device("h100-sxm-80gb")
        >>> d.peak_flops("bfloat16") > d.peak_flops("float32")
        True
    """

    name: str
    """Profile name."""
    kind: str
    """"gpu" or "cpu" (a few saved-tensor formats differ, e.g. dropout masks)."""
    peak_tflops: dict[str, float]
    """Dense peak TFLOP/s per dtype name ("float32", "bfloat16", ...)."""
    memory_bandwidth_gbps: float
    """Peak memory bandwidth, GB/s."""
    memory_bytes: int
    """Usable device memory in bytes."""
    matmul_efficiency: float = 0.7
    """Fraction of peak FLOP/s large matmuls and convolutions reach."""
    matmul_efficiency_by_dtype: dict[str, float] = field(default_factory=dict)
    """Per compute dtype, where it differs from :attr:`matmul_efficiency` (a measured profile:
    ``tensoropt calibrate --device`` times float32 GEMMs on CUDA cores and bfloat16 ones on tensor
    cores; each reaches its own fraction of its own peak). Empty: one efficiency for every dtype."""
    memory_efficiency: float = 0.8
    """Fraction of peak bandwidth memory-bound kernels reach."""
    kernel_launch_s: float = 5e-6
    """Per-kernel floor (launch + framework dispatch) in seconds."""
    op_overhead_local_s: float = 0.0
    """Executor host time per operator run on local shards, forward + backward, beyond the op itself
    (``tensoropt calibrate --overhead``; 0 by default: on a GPU it overlaps the kernels)."""
    op_overhead_dtensor_s: float = 0.0
    """Executor host time per operator run through DTensor dispatch, forward + backward, beyond the op
    itself (``tensoropt calibrate --overhead``; 0 by default)."""
    redistribute_overhead_s: float = 0.0
    """Host time of one DTensor redistribution beyond its collective (``tensoropt calibrate
    --overhead``; 0 by default)."""
    sync_point_s: float = 0.0
    """Time a blocking collective in the middle of a step costs beyond its collective fit: the wait of
    the rank that arrives first for the other, and its wake-up (:meth:`estimators.collectives.CommModel.
    blocking_time_s`; ``benchmarks/sync_points.py`` measures it). 0 by default (not measured)."""
    pipeline_microbatch_s: float = 0.0
    """Host time torch.distributed.pipelining's schedule adds per micro-batch on each stage, beyond
    the stage's operators and its transfers' ``alpha + bytes / beta``: the forward and backward
    actions' bookkeeping and their blocking point-to-point exchanges (the waiting rank loses its
    core: the same effect as ``sync_point_s``) (:func:`estimators.pipeline.schedule_overhead_s`;
    ``benchmarks/pipeline_step.py`` fits it). 0 by default (not measured)."""
    optimizer_bandwidth_gbps: float = 0.0
    """GB/s an Adam / AdamW step reaches over its parameter-sized passes (read p, g, both moments; write
    p and the moments: :data:`estimators.compute.OPTIMIZER_PASSES`) in torch's fused kernel, which the
    executor runs (:mod:`tensoropt.executor.state.local_optim`): one pass over the seven streams, not
    one copy after another (:func:`estimators.compute.optimizer_time_s`). 0 by default: the memory
    bandwidth times the memory efficiency, as any memory-bound kernel."""
    optimizer_tensor_s: float = 0.0
    """Host time of an optimizer step per parameter tensor beyond its bytes (the optimizer's
    per-tensor Python: state lookup, grouping, the gradient's unwrapping). 0 by default:
    :attr:`kernel_launch_s`."""
    runtime_overhead_bytes: int = 0
    """Memory a training process spends beyond the plan's tensors and the optimizer step's
    temporaries (the exported program, autograd, the collective backend's buffers, allocator
    slack): added to the predicted peak (:mod:`estimators.peak`); ``tensoropt calibrate --memory``
    measures it. 0 by default."""
    bytes_per_program_node: int = 0
    """Memory a training process spends per operator node of its replayed program as traced (the
    trace's and the program's Python objects, the heap they fragment): added to the predicted peak
    times the node count (:func:`estimators.peak.program_bytes`); ``tensoropt calibrate --memory``
    measures it. 0 by default."""
    sources: dict[str, str] = field(default_factory=dict, compare=False)
    """Citation of each constant."""

    def peak_flops(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype`` (falls back to float32's figure for unknown dtypes).

        Example:
            >>> load_device("cpu").peak_flops("float32") > 1e10
            True
        """
        return 1e12 * self.peak_tflops.get(dtype, self.peak_tflops["float32"])

    def matmul_efficiency_for(self, dtype: str) -> float:
        """The fraction of ``dtype``'s peak its large matmuls reach (:attr:`matmul_efficiency_by_dtype`,
        else :attr:`matmul_efficiency`).

        Example:
            >>> d = load_device("h100-sxm-80gb")
            >>> d.matmul_efficiency_for("bfloat16") == d.matmul_efficiency
            True
        """
        return self.matmul_efficiency_by_dtype.get(dtype, self.matmul_efficiency)

    @staticmethod
    def from_dict(data: dict, where: str = "<inline device>") -> Device:
        """Build and validate a device from its YAML mapping.

        Example:
            >>> Device.from_dict({"name": "x", "kind": "gpu", "peak_tflops": {"float32": 1},
            ...     "memory_bandwidth_gbps": 1, "memory_bytes": 1, "sources": {"peak_tflops": "a",
            ...     "memory_bandwidth_gbps": "b", "memory_bytes": "c"}}).name
            'x'
        """
        r = _Reader(data, where)
        r.check_unknown(
            {
                "name",
                "kind",
                "peak_tflops",
                "memory_bandwidth_gbps",
                "memory_bytes",
                "matmul_efficiency",
                "matmul_efficiency_by_dtype",
                "memory_efficiency",
                "kernel_launch_s",
                *OVERHEAD_KEYS,
                "sync_point_s",
                "pipeline_microbatch_s",
                "optimizer_bandwidth_gbps",
                "optimizer_tensor_s",
                "runtime_overhead_bytes",
                "bytes_per_program_node",
                "description",
            }
        )
        kind = r.text("kind", "gpu")
        if kind not in ("gpu", "cpu"):
            raise ProfileError(f"{where}: key 'kind' must be 'gpu' or 'cpu', got {kind!r}")
        peaks = data.get("peak_tflops")
        if not isinstance(peaks, dict) or "float32" not in peaks:
            raise ProfileError(
                f"{where}: key 'peak_tflops' must map dtype names to TFLOP/s and include float32"
            )
        if "peak_tflops" not in r.sources:
            raise ProfileError(f"{where}: key 'peak_tflops' has no citation; add it under 'sources:'")
        pr = _Reader(peaks, where, "peak_tflops.", {f"peak_tflops.{k}": "" for k in peaks})
        peak_tflops = {str(k): pr.number(str(k)) for k in peaks}
        by_dtype = data.get("matmul_efficiency_by_dtype") or {}
        if not isinstance(by_dtype, dict):
            raise ProfileError(f"{where}: key 'matmul_efficiency_by_dtype' must map dtype names to fractions")
        if by_dtype and "matmul_efficiency_by_dtype" not in r.sources:
            raise ProfileError(f"{where}: key 'matmul_efficiency_by_dtype' has no citation; "
                               "add it under 'sources:'")
        er = _Reader(by_dtype, where, "matmul_efficiency_by_dtype.",
                     {f"matmul_efficiency_by_dtype.{k}": "" for k in by_dtype})
        matmul_by_dtype = {str(k): er.number(str(k)) for k in by_dtype}
        for k, v in matmul_by_dtype.items():
            if v > 1:
                raise ProfileError(f"{where}: key 'matmul_efficiency_by_dtype.{k}' is a fraction of peak "
                                   "and must be <= 1")
        dev = Device(
            name=r.text("name", Path(where).stem),
            kind=kind,
            peak_tflops=peak_tflops,
            memory_bandwidth_gbps=r.number("memory_bandwidth_gbps"),
            memory_bytes=int(r.number("memory_bytes")),
            matmul_efficiency=r.number("matmul_efficiency", default=0.7, cited="matmul_efficiency" in data),
            matmul_efficiency_by_dtype=matmul_by_dtype,
            memory_efficiency=r.number("memory_efficiency", default=0.8, cited="memory_efficiency" in data),
            kernel_launch_s=r.number(
                "kernel_launch_s", positive=False, default=5e-6, cited="kernel_launch_s" in data
            ),
            **{k: r.number(k, positive=False, default=0.0, cited=k in data) for k in OVERHEAD_KEYS},
            sync_point_s=r.number("sync_point_s", positive=False, default=0.0, cited="sync_point_s" in data),
            pipeline_microbatch_s=r.number("pipeline_microbatch_s", positive=False, default=0.0,
                                           cited="pipeline_microbatch_s" in data),
            optimizer_bandwidth_gbps=r.number("optimizer_bandwidth_gbps", positive=False, default=0.0,
                                              cited="optimizer_bandwidth_gbps" in data),
            optimizer_tensor_s=r.number("optimizer_tensor_s", positive=False, default=0.0,
                                        cited="optimizer_tensor_s" in data),
            runtime_overhead_bytes=int(r.number("runtime_overhead_bytes", positive=False, default=0,
                                                cited="runtime_overhead_bytes" in data)),
            bytes_per_program_node=int(r.number("bytes_per_program_node", positive=False, default=0,
                                                cited="bytes_per_program_node" in data)),
            sources=dict(r.sources),
        )
        for k in ("matmul_efficiency", "memory_efficiency"):
            if getattr(dev, k) > 1:
                raise ProfileError(f"{where}: key {k!r} is a fraction of peak and must be <= 1")
        return dev


@dataclass(frozen=True)
class Link:
    """One level of the interconnect: alpha (per-step latency) and per-device bandwidth."""

    bandwidth_gbps: float
    """Per-device, one-direction bandwidth available to a collective on this level, GB/s."""
    latency_s: float
    """Per-step latency (alpha) of a ring step on this level, seconds."""

    @property
    def seconds_per_byte(self) -> float:
        """1 / bandwidth in seconds per byte."""
        return 1.0 / (self.bandwidth_gbps * 1e9)


@dataclass(frozen=True)
class CollectiveFit:
    """A measured alpha-beta fit ``time_s = alpha_s + beta_s_per_byte * nbytes`` of one collective.

    Backends change algorithm with the message size (gloo's all-reduce leaves the cache-resident
    regime near 1 MB), so a collective may have several fits, each valid from ``min_bytes`` up.
    """

    collective: str
    nproc: int
    level: str
    alpha_s: float
    beta_s_per_byte: float
    source: str = field(default="", compare=False)
    """Where the fit comes from (the calibration run)."""
    min_bytes: float = 0.0
    """Smallest message this fit applies to (the next fit up takes over at its own min_bytes)."""

    def time_s(self, nbytes: float) -> float:
        """Fitted time of one call on ``nbytes`` (the collective's n, see estimators.collectives).

        Example:
            >>> CollectiveFit("all_reduce", 2, "gpu", 1e-4, 1e-9).time_s(1e6)
            0.0011
        """
        return self.alpha_s + self.beta_s_per_byte * nbytes


@dataclass(frozen=True)
class Cluster:
    """A cluster: a device model, how many per node, and the two interconnect levels.

    Example:
        >>> c = load_cluster("h100-4x8-ib")
        >>> c.devices_per_node, c.intra_node.bandwidth_gbps > c.inter_node.bandwidth_gbps
        (8, True)
    """

    name: str
    device: Device
    devices_per_node: int
    """Devices in one node (mesh axes of level "gpu" live inside a node)."""
    num_nodes: int
    """Nodes available (the largest device count is num_nodes * devices_per_node)."""
    intra_node: Link
    inter_node: Link
    backend: str = "nccl"
    """Collective library: "nccl" or "gloo" (gloo has no all-to-all: all-gather + chunk instead)."""
    fits: tuple[CollectiveFit, ...] = ()
    """Calibrated collective fits (``tensoropt calibrate``); used where they match."""
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def has_all_to_all(self) -> bool:
        """Whether the backend implements all-to-all natively."""
        return self.backend != "gloo"

    @property
    def max_devices(self) -> int:
        """Largest device count this cluster offers."""
        return self.num_nodes * self.devices_per_node

    def link(self, level: str) -> Link:
        """The link of a mesh level ("gpu" = intra-node, "node" = inter-node)."""
        return self.inter_node if level == "node" else self.intra_node

    def fit_time_s(self, collective: str, nproc: int, level: str, nbytes: float) -> float | None:
        """Calibrated time of a collective on ``nbytes``, or None when no fit matches.

        With several size regimes the time is the largest of the fits that apply at ``nbytes``
        (each fit is increasing in size, so the result is too).

        Example:
            >>> import dataclasses
            >>> small = CollectiveFit("all_reduce", 2, "gpu", alpha_s=2e-4, beta_s_per_byte=1e-9)
            >>> large = CollectiveFit("all_reduce", 2, "gpu", 1e-3, 2e-9, min_bytes=2**20)
            >>> c = dataclasses.replace(load_cluster("cpu-local"), fits=(small, large))
            >>> c.fit_time_s("all_reduce", 2, "gpu", 0.0)  # only the small-message fit applies
            0.0002
            >>> round(c.fit_time_s("all_reduce", 2, "gpu", 2**21), 9)  # max(2.297 ms, 5.194 ms)
            0.005194304
            >>> c.fit_time_s("all_gather", 2, "gpu", 0.0) is None
            True
        """
        times = [
            f.time_s(nbytes)
            for f in self.fits
            if f.collective == collective and f.nproc == nproc and f.level == level and f.min_bytes <= nbytes
        ]
        return max(times) if times else None

    @staticmethod
    def from_dict(data: dict, where: str = "<inline cluster>") -> Cluster:
        """Build and validate a cluster from its YAML mapping (``device`` is a name, path or mapping).

        Example:
            >>> Cluster.from_dict(_read_yaml(_find("clusters", "h100x8"))).devices_per_node
            8
        """
        r = _Reader(data, where)
        r.check_unknown(
            {
                "name",
                "device",
                "devices_per_node",
                "num_nodes",
                "intra_node",
                "inter_node",
                "backend",
                "fits",
                "description",
            }
        )
        dev_spec = data.get("device")
        if isinstance(dev_spec, Device):
            device = dev_spec
        elif isinstance(dev_spec, dict):
            device = Device.from_dict(dev_spec, f"{where} (device)")
        elif isinstance(dev_spec, str):
            device = load_device(dev_spec)
        else:
            raise ProfileError(f"{where}: key 'device' must be a device profile name, path or mapping")
        backend = r.text("backend", "nccl")
        if backend not in ("nccl", "gloo"):
            raise ProfileError(f"{where}: key 'backend' must be 'nccl' or 'gloo', got {backend!r}")
        links = {}
        for lvl in ("intra_node", "inter_node"):
            lr = r.sub(lvl)
            lr.check_unknown({"bandwidth_gbps", "latency_s"})
            links[lvl] = Link(lr.number("bandwidth_gbps"), lr.number("latency_s", positive=False))
        fits = []
        raw_fits = data.get("fits") or []
        if not isinstance(raw_fits, list):
            raise ProfileError(f"{where}: key 'fits' must be a list of fits")
        for i, f in enumerate(raw_fits):
            fr = _Reader(f if isinstance(f, dict) else {}, where, f"fits[{i}].", {})
            if not isinstance(f, dict):
                raise ProfileError(f"{where}: key 'fits[{i}]' must be a mapping")
            fr.check_unknown(
                {"collective", "nproc", "level", "alpha_s", "beta_s_per_byte", "source", "min_bytes"}
            )
            coll = fr.text("collective")
            if coll not in COLLECTIVES:
                raise ProfileError(
                    f"{where}: key 'fits[{i}].collective' must be one of {COLLECTIVES}, got {coll!r}"
                )
            fits.append(
                CollectiveFit(
                    coll,
                    int(fr.number("nproc", cited=False)),
                    fr.text("level", "gpu"),
                    fr.number("alpha_s", positive=False, cited=False),
                    fr.number("beta_s_per_byte", positive=False, cited=False),
                    str(f.get("source", "")),
                    fr.number("min_bytes", positive=False, default=0.0, cited=False),
                )
            )
        return Cluster(
            name=r.text("name", Path(where).stem),
            device=device,
            devices_per_node=int(r.number("devices_per_node", cited=False)),
            num_nodes=int(r.number("num_nodes", cited=False)),
            intra_node=links["intra_node"],
            inter_node=links["inter_node"],
            backend=backend,
            fits=tuple(fits),
            sources=dict(r.sources),
        )


def load_device(spec: str | dict | Device) -> Device:
    """Load a device profile by name (``configs/devices/<name>.yaml``), path, or inline dict.

    Example:
        >>> load_device("a100-80gb").memory_bytes > load_device("a100-40gb").memory_bytes
        True
    """
    if isinstance(spec, Device):
        return spec
    if isinstance(spec, dict):
        return Device.from_dict(spec)
    path = _find("devices", spec)
    return Device.from_dict(_read_yaml(path), str(path))


def load_cluster(spec: str | os.PathLike | dict | Cluster) -> Cluster:
    """Load a cluster profile by name (``configs/clusters/<name>.yaml``), path, or inline dict.

    Example:
        >>> load_cluster("cpu-local").backend
        'gloo'
    """
    if isinstance(spec, Cluster):
        return spec
    if isinstance(spec, dict):
        return Cluster.from_dict(spec)
    path = _find("clusters", os.fspath(spec))
    return Cluster.from_dict(_read_yaml(path), str(path))


def cluster_to_dict(cluster: Cluster) -> dict[str, Any]:
    """YAML-ready mapping of a cluster (device inlined), the inverse of :meth:`Cluster.from_dict`.

    Example:
        >>> c = load_cluster("cpu-local")
        >>> Cluster.from_dict(cluster_to_dict(c)).fits == c.fits
        True
    """
    d = cluster.device
    return {
        "name": cluster.name,
        "device": {
            "name": d.name,
            "kind": d.kind,
            "peak_tflops": dict(d.peak_tflops),
            "memory_bandwidth_gbps": d.memory_bandwidth_gbps,
            "memory_bytes": d.memory_bytes,
            **{
                k: getattr(d, k)
                for k in ("matmul_efficiency", "memory_efficiency", "kernel_launch_s", *OVERHEAD_KEYS,
                          "sync_point_s", "pipeline_microbatch_s", "optimizer_bandwidth_gbps",
                          "optimizer_tensor_s", "runtime_overhead_bytes",
                          "bytes_per_program_node")
                if k in d.sources
            },
            **({"matmul_efficiency_by_dtype": dict(d.matmul_efficiency_by_dtype)}
               if d.matmul_efficiency_by_dtype else {}),
            "sources": dict(d.sources),
        },
        "devices_per_node": cluster.devices_per_node,
        "num_nodes": cluster.num_nodes,
        "backend": cluster.backend,
        "intra_node": {
            "bandwidth_gbps": cluster.intra_node.bandwidth_gbps,
            "latency_s": cluster.intra_node.latency_s,
        },
        "inter_node": {
            "bandwidth_gbps": cluster.inter_node.bandwidth_gbps,
            "latency_s": cluster.inter_node.latency_s,
        },
        "fits": [
            {
                "collective": f.collective,
                "nproc": f.nproc,
                "level": f.level,
                "alpha_s": f.alpha_s,
                "beta_s_per_byte": f.beta_s_per_byte,
                "source": f.source,
                "min_bytes": f.min_bytes,
            }
            for f in cluster.fits
        ],
        "sources": dict(cluster.sources),
    }
