"""What a pipeline stage pays besides its operators: sends and receives between stages, and the
split of an operator's time into per-micro-batch work and once-per-step work.

* :func:`p2p_time_s`: one point-to-point transfer between neighbouring stages, ``alpha + bytes /
  beta`` on the link between them (inter-node when a stage fills whole nodes, PIPELINE.md);
* :func:`once_per_step_s`: the part of a configuration's time that runs once per step whatever
  the micro-batch count (its parameters' gradient all-reduce and their optimizer step), priced by
  the same functions as :func:`estimators.op_costs.node_cost`; the rest repeats per micro-batch;
* :func:`schedule_overhead_s`: the host time torch's schedule adds per micro-batch on a stage (its
  actions' bookkeeping and blocking exchanges), a measured figure of the device.
"""

from __future__ import annotations

from estimators.collectives import grad_all_reduce_time_s
from estimators.compute import optimizer_time_s
from estimators.configuration import Configuration
from estimators.op_costs import CostModel, param_bytes
from estimators.profiles import Cluster


def p2p_time_s(cluster: Cluster, nbytes: float, devices_per_stage: int) -> float:
    """Seconds to send ``nbytes`` from a device of one stage to its peer in the next stage.

    Stages of ``devices_per_stage >= devices_per_node`` devices sit on different nodes (the
    inter-node link); smaller stages share a node (the intra-node link).

    Example:
        >>> from estimators.profiles import load_cluster
        >>> c = load_cluster("h100-4x8-ib")
        >>> p2p_time_s(c, 1e9, 8) > p2p_time_s(c, 1e9, 4) > 0
        True
    """
    if nbytes <= 0:
        return 0.0
    link = cluster.inter_node if devices_per_stage >= cluster.devices_per_node else cluster.intra_node
    return link.latency_s + nbytes * link.seconds_per_byte


def once_per_step_s(model: CostModel, node: dict, config: Configuration) -> float:
    """The part of ``node``'s time under ``config`` that runs once per step, not per micro-batch.

    Its own (not shared) parameters' gradient all-reduce over the configuration's
    ``grad_sync_axes`` and their optimizer step. A pipeline accumulates gradients over its
    micro-batches and synchronises them once (PIPELINE.md: ``delta``).

    Example:
        >>> from estimators.profiles import load_cluster
        >>> from estimators.configuration import Mesh
        >>> model = CostModel(load_cluster("h100x8"), Mesh((2,), ("gpu",)), "adamw")
        >>> node = {"params": {"w": (1024, 1024)}, "out_dtype": "float32"}
        >>> c = Configuration("batch=2", (("batch", (0,)),), (("S(0)",),), (("w", ("R",)),), ("S(0)",),
        ...                   grad_sync_axes=(("w", (0,)),))
        >>> once_per_step_s(model, node, c) > once_per_step_s(model, node, Configuration(
        ...     "replicate", (), (("R",),), (("w", ("R",)),), ("R",))) > 0
        True
    """
    params = dict(config.params)
    sync = dict(config.grad_sync_axes)
    shared = set(node.get("shared_params") or ())
    dtype = str(node.get("out_dtype", "float32"))
    time_s, own_bytes, own = 0.0, 0, 0
    for key, shape in node.get("params", {}).items():
        if key in shared:
            continue
        pb = param_bytes(model, shape, params.get(key, ("R",) * len(model.mesh.shape)), dtype)
        own_bytes += pb.stored
        own += 1
        if sync.get(key):
            time_s += grad_all_reduce_time_s(model.comm, pb.grad, sync[key], None)
    return time_s + optimizer_time_s(model.cluster.device, own_bytes, own, model.optimizer)


def schedule_overhead_s(cluster: Cluster, num_stages: int) -> float:
    """Seconds torch.distributed.pipelining's schedule adds per micro-batch on one stage, beyond its
    operators and :func:`p2p_time_s`: the device's measured ``pipeline_microbatch_s``
    (``configs/devices/*.yaml``; ``benchmarks/pipeline_step.py`` fits it from measured steps). A
    single stage exchanges nothing and pays none.

    Example:
        >>> import dataclasses
        >>> from estimators.profiles import load_cluster
        >>> c = load_cluster("h100x8")
        >>> c = dataclasses.replace(c, device=dataclasses.replace(c.device, pipeline_microbatch_s=2e-3))
        >>> schedule_overhead_s(c, 2), schedule_overhead_s(c, 1)
        (0.002, 0.0)
    """
    return cluster.device.pipeline_microbatch_s if num_stages > 1 else 0.0


def tied_all_reduce_s(cluster: Cluster, nbytes: float, devices_per_stage: int) -> float:
    """Seconds of the once-per-step all-reduce (sum) of a tied parameter's gradient between the two
    stages holding a copy (the embedding's on the first stage, the head's on the last): a ring of 2
    ranks, a reduce-scatter and an all-gather of ``nbytes / 2`` each, on the link between stages
    (:func:`p2p_time_s`'s).

    Example:
        >>> from estimators.profiles import load_cluster
        >>> c = load_cluster("h100-4x8-ib")
        >>> tied_all_reduce_s(c, 1e9, 8) > tied_all_reduce_s(c, 1e9, 4) > 0, tied_all_reduce_s(c, 0, 8)
        (True, 0.0)
    """
    if nbytes <= 0:
        return 0.0
    return 2 * p2p_time_s(cluster, nbytes / 2, devices_per_stage)


def tied_copy_cost(model: CostModel, node: dict, config: Configuration, key: str) -> dict[str, float]:
    """What the stage of a tied parameter's other user (``node``: the head reading the embedding's
    weight ``key``) pays for its own copy of it when the parameter's first user sits in another stage:
    the state the node's cost leaves to the first user (``shared_params``), in the node's parameter
    layout -- ``param_bytes``, ``grad_bytes``, ``optimizer_bytes`` -- and ``step_s``, the copy's
    once-per-step work: its gradient's all-reduce over the configuration's ``grad_sync_axes`` and its
    optimizer step (priced as :func:`once_per_step_s` prices an own parameter). The all-reduce
    between the two stages is :func:`tied_all_reduce_s`.

    Example:
        >>> from estimators.profiles import load_cluster
        >>> from estimators.configuration import Mesh
        >>> model = CostModel(load_cluster("h100x8"), Mesh((2,), ("gpu",)), "adamw")
        >>> node = {"params": {"w": (1024, 256)}, "shared_params": ["w"], "out_dtype": "float32"}
        >>> c = Configuration("batch=2", (("batch", (0,)),), (("S(0)",),), (("w", ("R",)),), ("S(0)",),
        ...                   grad_sync_axes=(("w", (0,)),))
        >>> cost = tied_copy_cost(model, node, c, "w")
        >>> cost["param_bytes"], cost["grad_bytes"], cost["optimizer_bytes"], cost["step_s"] > 0
        (1048576.0, 1048576.0, 2097152.0, True)
    """
    from estimators.memory import optimizer_factor

    shape = node["params"][key]
    layout = dict(config.params).get(key, ("R",) * len(model.mesh.shape))
    pb = param_bytes(model, shape, layout, str(node.get("out_dtype", "float32")))
    sync = dict(config.grad_sync_axes).get(key)
    step_s = grad_all_reduce_time_s(model.comm, pb.grad, sync, None) if sync else 0.0
    step_s += optimizer_time_s(model.cluster.device, pb.stored, 1, model.optimizer)
    return {"param_bytes": float(pb.stored), "grad_bytes": float(pb.grad),
            "optimizer_bytes": float(pb.stored * optimizer_factor(model.optimizer)), "step_s": step_s}
