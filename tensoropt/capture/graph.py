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
import torch

from tensoropt.capture.dims import assign_dim_names
from tensoropt.capture.ops import op_attrs, op_flops, op_kind, opaque_dim_args
from tensoropt.capture.views import SPLIT_OPS, VIEW_OPS, compose, view_dim_map


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


def op_name(target) -> str:
    """Name of an fx call target: ``"aten.linear.default"``, ``"operator.getitem"``, ...

    Example:
        >>> import torch, operator
        >>> op_name(torch.ops.aten.linear.default), op_name(operator.getitem)
        ('aten.linear.default', 'operator.getitem')
    """
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    module = getattr(target, "__module__", None) or "builtins"
    module = "operator" if module in ("_operator", "operator") else module
    return f"{module}.{getattr(target, '__name__', str(target))}"


def _val(node):
    v = node.meta.get("val")
    if isinstance(v, (tuple, list)):
        v = v[0] if v else None
    return v


def _shape(node) -> tuple[int, ...]:
    v = _val(node)
    return tuple(int(s) for s in v.shape) if isinstance(v, torch.Tensor) else ()


def _dtype(node) -> str:
    v = _val(node)
    return str(v.dtype).replace("torch.", "") if isinstance(v, torch.Tensor) else "unknown"


def _module(node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    return list(stack.values())[-1][0]


def tensor_args(node) -> list:
    """Tensor operands of an fx node in order: args, then kwargs, lists and tuples flattened.

    This is the order of the OpGraph ``operands`` attribute and of :func:`operand_roles`.

    Example:
        >>> import torch
        >>> g = torch.fx.Graph(); x = g.placeholder("x")
        >>> [a.name for a in tensor_args(g.call_function(torch.cat, ([x, x], 0)))]
        ['x', 'x']
    """
    out = []

    def visit(a):
        if isinstance(a, torch.fx.Node):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            for x in a:
                visit(x)

    for a in node.args:
        visit(a)
    for a in node.kwargs.values():
        visit(a)
    return out


_RANK = {"static": 0, "param": 1, "data": 2}


def _classify(ep) -> tuple[dict, dict]:
    """Role of every fx node (param/buffer/input/static/view/compute/output) and its key."""
    sig = ep.graph_signature
    params = dict(sig.inputs_to_parameters)
    buffers = dict(sig.inputs_to_buffers)
    buffers.update(getattr(sig, "inputs_to_lifted_tensor_constants", {}) or {})
    user = set(sig.user_inputs)
    role, key, dep = {}, {}, {}
    for n in ep.graph.nodes:
        if n.op == "placeholder":
            if n.name in params:
                role[n], key[n], dep[n] = "param", params[n.name], "param"
            elif n.name in buffers:
                role[n], key[n], dep[n] = "buffer", buffers[n.name], "static"
            elif n.name in user:
                role[n], dep[n] = "input", "data"
            else:
                role[n], key[n], dep[n] = "buffer", n.name, "static"
        elif n.op == "call_function":
            d = max((dep[a] for a in tensor_args(n)), key=_RANK.get, default="static")
            dep[n] = d
            if d == "static":
                role[n] = "static"
            elif op_name(n.target) in VIEW_OPS:
                role[n] = "view"
            else:
                role[n] = "compute"
        elif n.op == "get_attr":
            role[n], key[n], dep[n] = "buffer", str(n.target), "static"
        else:
            role[n] = "output"
    return role, key


def _static_key(n, role, key) -> str:
    """Key of a buffer-like operand: the buffer's key, the single buffer a static op derives from,
    else the static op's own name (e.g. ``arange``)."""
    if role[n] == "buffer":
        return key[n]
    roots, stack, seen = set(), [n], set()
    while stack:
        cur = stack.pop()
        if cur in seen:
            continue
        seen.add(cur)
        if role[cur] == "buffer":
            roots.add(key[cur])
        elif role[cur] == "static":
            stack.extend(tensor_args(cur))
    return roots.pop() if len(roots) == 1 else n.name


def _resolve(arg, role):
    """Walk back through folded views: (root fx node, [view op names], dim map root -> arg)."""
    chain = []
    cur = arg
    while role.get(cur) == "view":
        chain.append(cur)
        cur = cur.args[0]
    root = cur
    chain.reverse()  # root first
    dim_map: list[int | None] = list(range(len(_shape(root))))
    shape = _shape(root)
    for i, v in enumerate(chain):
        op = op_name(v.target)
        if op == "operator.getitem":
            if i > 0 and op_name(chain[i - 1].target) in SPLIT_OPS:
                continue  # the split op before it already mapped to this element
            # an element of a tuple-valued compute op: element 0 is the node's output
            step = list(range(len(shape))) if v.args[1] == 0 else [None] * len(shape)
            out_shape = _shape(v)
        else:
            picked = chain[i + 1] if op in SPLIT_OPS and i + 1 < len(chain) else v
            out_shape = _shape(picked)
            step = view_dim_map(op, v.args, shape, out_shape)
        dim_map = compose(dim_map, step)
        shape = out_shape
    return root, [op_name(v.target) for v in chain], dim_map


def build_graph(ep) -> OpGraph:
    """Build the OpGraph of an ExportedProgram (see the module docstring).

    Example:
        >>> import torch
        >>> from tensoropt.capture.export import export_program
        >>> g = build_graph(export_program(torch.nn.Linear(4, 2), (torch.randn(3, 4),)))
        >>> sorted(g.nx.nodes), g.nx.nodes["linear"]["params"]
        (['input', 'linear'], {'weight': (2, 4), 'bias': (2,)})
    """
    role, key = _classify(ep)
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
                out_shape=_shape(n),
                out_dtype=_dtype(n),
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
                root, _, _ = _resolve(a, role)
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
    assign_dim_names(g)
    return OpGraph(nx=g, program=ep)


def operand_roles(ep) -> dict[str, list[str]]:
    """Role of every tensor operand of every compute node: ``"input"``, ``"param"`` or ``"buffer"``.

    The order is the node's tensor arguments (args, then kwargs, lists flattened), the order of
    the OpGraph ``operands`` attribute. ``Configuration.inputs`` has one layout per ``"input"``
    operand; ``"buffer"`` operands (buffers, constants, and static ops such as ``arange`` or an
    ``alias`` of a mask buffer) have none: they are replicated.

    Example:
        >>> import torch
        >>> from tensoropt.capture.export import export_program
        >>> operand_roles(export_program(torch.nn.Linear(4, 2), (torch.randn(3, 4),)))
        {'linear': ['input', 'param', 'param']}
    """
    role, _ = _classify(ep)
    out = {}
    for n in ep.graph.nodes:
        if role[n] == "compute":
            roles = []
            for a in tensor_args(n):
                root, _, _ = _resolve(a, role)
                r = role[root]
                roles.append("param" if r == "param" else "buffer" if r in ("buffer", "static") else "input")
            out[n.name] = roles
    return out


def _add_compute(g, n, role, key, seen_params, opaque) -> None:
    op = op_name(n.target)
    kind = op_kind(op)
    inputs, operands, params, shared, buffers = [], [], {}, [], {}
    for arg_index, a in enumerate(tensor_args(n)):
        root, views, dim_map = _resolve(a, role)
        r = role[root]
        entry = {"shape": _shape(a), "dim_map": dim_map, "views": views}
        if r == "param":
            k = key[root]
            params[k] = _shape(root)
            if k in seen_params and k not in shared:
                shared.append(k)
            operands.append({"role": "param", "key": k, **entry})
        elif r in ("buffer", "static"):
            k = _static_key(root, role, key)
            buffers[k] = _shape(root)
            operands.append({"role": "buffer", "key": k, **entry})
        else:
            operands.append({"role": "input", "index": len(inputs), **entry})
            inputs.append(
                {
                    "source": root.name,
                    "shape": _shape(a),
                    "dtype": _dtype(a),
                    "views": views,
                    "dim_map": dim_map,
                    "arg_index": arg_index,
                }
            )
    seen_params.update(params)
    shapes = [o["shape"] for o in operands]
    attrs = op_attrs(op, kind, n.args, n.kwargs, shapes)
    out_shape = _shape(n)
    module = _module(n)
    if kind == "opaque":
        opaque.setdefault(op, set()).add(module)
        rank = len(shapes[0]) if shapes else 0
        attrs["dim_args"] = opaque_dim_args(n.target, n.args, n.kwargs, rank)
    g.add_node(
        n.name,
        op=op,
        kind=kind,
        out_shape=out_shape,
        out_dtype=_dtype(n),
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
            nbytes = _numel(ud["out_shape"]) * _itemsize(ud["out_dtype"])
            g.add_edge(u, n.name, shape=ud["out_shape"], dtype=ud["out_dtype"], bytes=nbytes, operands=[i])


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _itemsize(dtype: str) -> int:
    try:
        return getattr(torch, dtype).itemsize
    except AttributeError:
        return 4
