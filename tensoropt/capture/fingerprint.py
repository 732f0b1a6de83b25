"""A plan's binding to its graph: a fingerprint of the captured graph and of the job fields shaping it.

``tensoropt plan`` writes :func:`fingerprint` into frontier.json and plan.json (key ``graph``);
``tensoropt run`` and every worker compare the graph they run against it (:func:`mismatch`) and
refuse a plan made for another graph, naming the first node that differs.

A node is described by ``[name, op, output shape, output dtype, {parameter key: shape}]``.

Example:
    >>> import torch
    >>> from tensoropt.capture import capture
    >>> g = capture(torch.nn.Linear(3, 2), (torch.ones(4, 3),))
    >>> fp = fingerprint(g, {"global_batch_size": 4})
    >>> fp["nodes"][1]
    ['linear', 'aten.linear.default', [4, 2], 'float32', {'weight': [2, 3], 'bias': [2]}]
    >>> mismatch(fp, fingerprint(g, {"global_batch_size": 4})) is None
    True
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

FINGERPRINT_VERSION = 1
"""Bumped when the node description changes (a plan of another version is compared by names only)."""

GRAPH_JOB_FIELDS = {
    "model": ("name", "factory", "kwargs", "task", "input_shape", "num_classes", "seq_len", "vocab_size",
              "inputs", "targets", "loss"),
    "training": ("global_batch_size", "precision", "dtype"),
}
"""The job fields that shape the captured graph (the model, its inputs and loss, batch, precision)."""


def node_rows(graph) -> list[list]:
    """``[name, op, out_shape, out_dtype, params]`` of every node of an OpGraph, in graph order.

    Example:
        >>> import torch
        >>> from tensoropt.capture import capture
        >>> [r[0] for r in node_rows(capture(torch.nn.ReLU(), (torch.ones(2),)))]
        ['input', 'relu']
    """
    rows = []
    for name, d in graph.nx.nodes(data=True):
        params = {k: _plain(v) for k, v in (d.get("params") or {}).items()}
        rows.append([name, str(d.get("op")), _plain(d.get("out_shape")), str(d.get("out_dtype")), params])
    return rows


def job_fields(job: Any) -> dict:
    """The fields of a job (a ``Job`` or its dict) that shape the graph (:data:`GRAPH_JOB_FIELDS`).

    Example:
        >>> job_fields({"model": {"name": "mlp", "seed": 3}, "training": {"global_batch_size": 8}})
        {'model': {'name': 'mlp'}, 'training': {'global_batch_size': 8}}
    """
    data = job if isinstance(job, dict) else job.to_dict()
    out = {}
    for section, keys in GRAPH_JOB_FIELDS.items():
        values = data.get(section) or {}
        out[section] = {k: values[k] for k in keys if values.get(k) is not None}
    return out


def fingerprint(graph, job: Any) -> dict:
    """The ``graph`` entry of frontier.json / plan.json: digests, the node rows and the job's fields.

    Args:
        graph: the captured OpGraph.
        job: the resolved job (``Job`` or its dict).

    Example:
        >>> import torch
        >>> from tensoropt.capture import capture
        >>> sorted(fingerprint(capture(torch.nn.ReLU(), (torch.ones(2),)), {}))
        ['digest', 'job', 'job_digest', 'nodes', 'version']
    """
    rows = node_rows(graph)
    fields = job_fields(job)
    return {"version": FINGERPRINT_VERSION, "digest": _digest(rows), "job_digest": _digest(fields),
            "nodes": rows, "job": fields}


def mismatch(planned: dict | None, running: dict, plan_nodes: set[str] | None = None,
             dtypes: bool = True) -> str | None:
    """Why the graph being run is not the graph a plan was made for (None when they agree).

    Args:
        planned: the plan's ``graph`` entry (None for a plan written before fingerprints: then
            only ``plan_nodes`` are checked against the running graph's node names).
        running: :func:`fingerprint` of the graph being run.
        plan_nodes: the node names the plan places (checked when ``planned`` is None).
        dtypes: compare the nodes' dtypes (False for the executor's float64 numerical checks,
            which run a float32 plan's layouts in float64).

    Returns:
        A message naming the first differing node; None if the graphs agree.

    Example:
        >>> row = ["fc", "aten.linear.default", [4, 2], "float32", {}]
        >>> a = {"version": 1, "digest": "x", "nodes": [row]}
        >>> b = {"version": 1, "digest": "y", "nodes": [row[:2] + [[8, 2]] + row[3:]]}
        >>> mismatch(a, b).split(", the model gives ")
        ["node 'fc': the plan has aten.linear.default [4, 2] float32", 'aten.linear.default [8, 2] float32']
    """
    if planned is None:
        names = {r[0] for r in running["nodes"]}
        unknown = sorted((plan_nodes or set()) - names)
        return f"the plan places node {unknown[0]!r}, which the model's graph lacks" if unknown else None
    same_version = planned.get("version") == running.get("version")
    if same_version and planned.get("digest") == running.get("digest"):
        return None
    if not dtypes:
        planned = {**planned, "nodes": [_without_dtype(r) for r in planned.get("nodes", [])]}
        running = {**running, "nodes": [_without_dtype(r) for r in running["nodes"]]}
    ours = {r[0]: r for r in running["nodes"]}
    theirs = {r[0] for r in planned.get("nodes", [])}
    for row in planned.get("nodes", []):
        other = ours.get(row[0])
        if other is None:
            return f"node {row[0]!r} ({row[1]} {row[2]}) of the plan is not in the model's graph"
        if same_version and other != row:
            return f"node {row[0]!r}: the plan has {_describe(row)}, the model gives {_describe(other)}"
    extra = [r for r in running["nodes"] if r[0] not in theirs]
    if extra:
        return f"node {extra[0][0]!r} ({extra[0][1]} {extra[0][2]}) of the model's graph is not in the plan"
    order = [r[0] for r in planned.get("nodes", [])] != [r[0] for r in running["nodes"]]
    return "the graphs differ in the order of their nodes" if same_version and order else None


def job_difference(planned: dict | None, running: dict) -> list[str]:
    """The graph-shaping job fields (``model.kwargs`` ...) whose values differ between plan and run.

    Example:
        >>> a = {"job_digest": "1", "job": {"model": {"kwargs": {"p": 0.1}}}}
        >>> job_difference(a, {"job_digest": "2", "job": {"model": {"kwargs": {"p": 0.2}}}})
        ['model.kwargs']
    """
    if planned is None or planned.get("job_digest") == running.get("job_digest"):
        return []
    a, b = planned.get("job") or {}, running.get("job") or {}
    out = []
    for section in sorted(set(a) | set(b)):
        sa, sb = a.get(section) or {}, b.get(section) or {}
        out += [f"{section}.{k}" for k in sorted(set(sa) | set(sb)) if sa.get(k) != sb.get(k)]
    return out


def _without_dtype(row: list) -> list:
    return [*row[:3], "", *row[4:]]


def _describe(row: list) -> str:
    return f"{row[1]} {row[2]} {row[3]}" + (f" with parameters {row[4]}" if row[4] else "")


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return int(value) if hasattr(value, "__index__") else value
