"""OpGraph: the operator graph of one training step, built from a torch.export program.

One node per compute operator (node name = the fx node name). Folded into nodes and edges:

* parameter placeholders -> ``params`` of the nodes that consume them (state-dict key -> shape);
  a parameter consumed by several nodes (tied weights) is in each one's ``params`` and listed in
  ``shared_params`` of all but the first, so summing ``params`` minus ``shared_params`` counts each
  parameter once;
* buffer / constant placeholders and *static* ops (ops computed from buffers and constants only,
  e.g. ``arange`` for positions, slicing a causal-mask buffer, ``num_batches_tracked += 1``) ->
  ``buffers`` of their consumers (key -> shape); every static op is listed in the graph attribute
  ``static_ops`` so nothing is dropped silently;
* pure view / metadata ops (``views.VIEW_OPS``) -> the ``views`` and ``dim_map`` of the consuming
  node's ``inputs`` entry.

Node attributes: ``op``, ``kind``, ``out_shape``, ``out_dtype``, ``params``, ``shared_params``,
``buffers``, ``flops``, ``module``, ``inputs`` (per activation operand: ``source``, ``shape``,
``dtype``, ``views``, ``dim_map``, ``arg_index``), ``operands`` (every tensor operand in argument
order: ``{"role": "input"|"param"|"buffer", "index"|"key", "shape", "dim_map"}``), ``attrs``,
``dim_names`` (see :mod:`tensoropt.capture.dims`). Edge attributes: ``shape``, ``dtype``,
``bytes``, ``operands`` (indices into the consumer's ``inputs``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import networkx as nx

from estimators.dtypes import itemsize as _itemsize
from estimators.memory import numel
from tensoropt.capture.dims import assign_dim_names
from tensoropt.capture.fxroles import (
    classify,
    dtype_of,
    module_of,
    op_name,
    resolve,
    shape_of,
    static_key,
    tensor_args,
)
from tensoropt.capture.ops import op_attrs, op_flops, op_kind, opaque_dim_args

# op_name and tensor_args are imported from here by the executor: keep them importable
__all__ = ["CaptureWarning", "OpGraph", "build_graph", "op_name", "tensor_args"]


class CaptureWarning(UserWarning):
    """An operator has no parallel rule and is captured as an opaque node."""


@dataclass
class OpGraph:
    """The captured operator graph.

    Attributes:
        nx: the ``networkx.DiGraph`` (node and edge attributes: see the module docstring).
        program: the ``torch.export.ExportedProgram`` it was built from.
    """

    nx: nx.DiGraph
    program: object = field(repr=False)

    @property
    def inputs(self) -> list[str]:
        """Names of the user-input nodes, in forward-argument order."""
        return list(self.nx.graph["inputs"])

    @property
    def outputs(self) -> list[str]:
        """Names of the nodes producing the model's outputs (the loss for zoo models)."""
        return list(self.nx.graph["outputs"])

    @property
    def params(self) -> dict[str, tuple[int, ...]]:
        """Every parameter once: state-dict key -> shape."""
        out: dict[str, tuple[int, ...]] = {}
        for _, data in self.nx.nodes(data=True):
            out.update(data["params"])
        return out

    def num_params(self) -> int:
        """Total number of parameter elements (tied parameters counted once).

        Example:
            >>> import torch
            >>> from tensoropt.capture import capture
            >>> capture(torch.nn.Linear(4, 2), (torch.randn(3, 4),)).num_params()
            10
        """
        total = 0
        for shape in self.params.values():
            n = 1
            for s in shape:
                n *= s
            total += n
        return total

    def total_flops(self) -> int:
        """Sum of the nodes' forward FLOPs."""
        return sum(int(d["flops"]) for _, d in self.nx.nodes(data=True))

    def compute_nodes(self) -> list[str]:
        """Node names in topological order, input nodes excluded."""
        return [n for n in nx.topological_sort(self.nx) if self.nx.nodes[n]["kind"] != "input"]

    def summary(self) -> str:
        """One line: node/edge counts, parameters, forward GFLOPs, kinds."""
        kinds: dict[str, int] = {}
        for _, d in self.nx.nodes(data=True):
            kinds[d["kind"]] = kinds.get(d["kind"], 0) + 1
        kind_text = ", ".join(f"{k}={v}" for k, v in sorted(kinds.items()))
        return (
            f"{self.nx.number_of_nodes()} nodes, {self.nx.number_of_edges()} edges, "
            f"{self.num_params() / 1e6:.2f}M params, {self.total_flops() / 1e9:.3f} GFLOP fwd ({kind_text})"
        )


def build_graph(ep) -> OpGraph:
    """Build the OpGraph of an ExportedProgram (see the module docstring).

    Example:
        >>> import torch
        >>> from tensoropt.capture.export import export_program
        >>> g = build_graph(export_program(torch.nn.Linear(4, 2), (torch.randn(3, 4),)))
        >>> sorted(g.nx.nodes), g.nx.nodes["linear"]["params"]
        (['input', 'linear'], {'weight': (2, 4), 'bias': (2,)})
    """
    role, key = classify(ep)
    g = nx.DiGraph()
    g.graph["inputs"], g.graph["outputs"], g.graph["static_ops"] = [], [], []
    seen_params: set[str] = set()
    opaque: dict[str, set[str]] = {}
    for n in ep.graph.nodes:
        r = role[n]
        if r == "input":
            g.add_node(
                n.name,
                op="input",
                kind="input",
                out_shape=shape_of(n),
                out_dtype=dtype_of(n),
                params={},
                shared_params=[],
                buffers={},
                flops=0,
                module="",
                inputs=[],
                operands=[],
                attrs={},
            )
            g.graph["inputs"].append(n.name)
        elif r == "static":
            g.graph["static_ops"].append(n.name)
        elif r == "compute":
            _add_compute(g, n, role, key, seen_params, opaque)
        elif r == "output":
            for a in tensor_args(n):
                root, _, _ = resolve(a, role)
                if role[root] in ("compute", "input") and root.name not in g.graph["outputs"]:
                    g.graph["outputs"].append(root.name)
    for op, modules in opaque.items():
        warnings.warn(
            f"tensoropt.capture: operator {op} (in module {', '.join(sorted(modules)) or '<root>'}) has no "
            "parallel rule; it is captured as an opaque node that allows only replicated (and, where "
            "shape-safe, batch-split) configurations",
            CaptureWarning,
            stacklevel=3,
        )
    _record_unused_params(g, ep, seen_params)
    g.graph["dropped_ops"] = dict(ep.graph_module.meta.get("dropped_ops", {}))  # capture/assertions.py
    assign_dim_names(g)
    return OpGraph(nx=g, program=ep)


def _record_unused_params(g: nx.DiGraph, ep, used: set[str]) -> None:
    """Graph attributes ``tied_params`` (unused key -> the used key of the same tensor) and
    ``unused_params`` (key -> shape of parameters no operator reads)."""
    state = ep.state_dict
    by_id = {id(state[k]): k for k in used if k in state}
    g.graph["tied_params"], g.graph["unused_params"] = {}, {}
    for key in ep.graph_signature.inputs_to_parameters.values():
        if key in used:
            continue
        if key in state and id(state[key]) in by_id:
            g.graph["tied_params"][key] = by_id[id(state[key])]
        else:
            g.graph["unused_params"][key] = tuple(state[key].shape) if key in state else ()


def _add_compute(g, n, role, key, seen_params, opaque) -> None:
    op = op_name(n.target)
    kind = op_kind(op)
    inputs, operands, params, shared, buffers = [], [], {}, [], {}
    for arg_index, a in enumerate(tensor_args(n)):
        root, views, dim_map = resolve(a, role)
        r = role[root]
        entry = {"shape": shape_of(a), "dim_map": dim_map, "views": views}
        if r == "param":
            k = key[root]
            params[k] = shape_of(root)
            if k in seen_params and k not in shared:
                shared.append(k)
            operands.append({"role": "param", "key": k, **entry})
        elif r in ("buffer", "static"):
            k = static_key(root, role, key)
            buffers[k] = shape_of(root)
            operands.append({"role": "buffer", "key": k, **entry})
        else:
            operands.append({"role": "input", "index": len(inputs), **entry})
            inputs.append(
                {
                    "source": root.name,
                    "shape": shape_of(a),
                    "dtype": dtype_of(a),
                    "views": views,
                    "dim_map": dim_map,
                    "arg_index": arg_index,
                }
            )
    seen_params.update(params)
    shapes = [o["shape"] for o in operands]
    attrs = op_attrs(op, kind, n.args, n.kwargs, shapes)
    out_shape = shape_of(n)
    module = module_of(n)
    if kind == "opaque":
        opaque.setdefault(op, set()).add(module)
        rank = len(shapes[0]) if shapes else 0
        attrs["dim_args"] = opaque_dim_args(n.target, n.args, n.kwargs, rank)
    g.add_node(
        n.name,
        op=op,
        kind=kind,
        out_shape=out_shape,
        out_dtype=dtype_of(n),
        params=params,
        shared_params=shared,
        buffers=buffers,
        flops=int(op_flops(kind, attrs, shapes, out_shape, op)),
        module=module,
        inputs=inputs,
        operands=operands,
        attrs=attrs,
    )
    for i, entry in enumerate(inputs):
        u = entry["source"]
        if g.has_edge(u, n.name):
            g.edges[u, n.name]["operands"].append(i)
        else:
            ud = g.nodes[u]
            nbytes = numel(ud["out_shape"]) * _itemsize(ud["out_dtype"])
            g.add_edge(u, n.name, shape=ud["out_shape"], dtype=ud["out_dtype"], bytes=nbytes, operands=[i])
