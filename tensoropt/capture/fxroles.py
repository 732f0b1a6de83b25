"""Roles of the fx nodes of an exported program, and the walk back through folded views.

Every fx node is a parameter, buffer (or constant), user input, *static* op (computed from buffers
and constants only), pure view, compute op or output. :func:`resolve` follows an operand back
through views to its root and composes the views' dim maps.
"""

from __future__ import annotations

import torch

from tensoropt.capture.ops import op_kind
from tensoropt.capture.views import SPLIT_OPS, VIEW_OPS, compose, view_dim_map


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


def shape_of(node) -> tuple[int, ...]:
    """Shape of an fx node's value (first element of a tuple), ``()`` if not a tensor."""
    v = _val(node)
    return tuple(int(s) for s in v.shape) if isinstance(v, torch.Tensor) else ()


def dtype_of(node) -> str:
    """dtype of an fx node's value as ``"float32"``."""
    v = _val(node)
    return str(v.dtype).replace("torch.", "") if isinstance(v, torch.Tensor) else "unknown"


def module_of(node) -> str:
    """Owning module path from ``nn_module_stack`` (``""`` for the root)."""
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


def classify(ep) -> tuple[dict, dict]:
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


def static_key(n, role, key) -> str:
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


def same_layout_element(node, element_shape: tuple[int, ...]) -> bool:
    """Whether an element of tuple-valued ``node``'s output (of ``element_shape``) is laid out like its
    element 0: ``node`` is of kind ``broadcast`` (``ops.op_kind``: ``broadcast_tensors``, each element
    its input expanded) and all its tensor inputs and the element have element 0's shape.

    Example:
        >>> from tensoropt.capture.export import export_program
        >>> ep = export_program(torch.nn.MSELoss(), (torch.ones(4, 3), torch.ones(4, 3)))
        >>> node = next(n for n in ep.graph.nodes if op_name(n.target) == "aten.broadcast_tensors.default")
        >>> same_layout_element(node, (4, 3)), same_layout_element(node, (1, 3))
        (True, False)
    """
    if op_kind(op_name(node.target)) != "broadcast":
        return False
    first = shape_of(node)
    inputs = [a for a in (node.args[0] if node.args else []) if hasattr(a, "meta")]
    return tuple(element_shape) == first and all(shape_of(a) == first for a in inputs)


def resolve(arg, role):
    """Walk back through folded views: (root fx node, [view op names], dim map root -> arg)."""
    chain = []
    cur = arg
    while role.get(cur) == "view":
        chain.append(cur)
        cur = cur.args[0]
    root = cur
    chain.reverse()  # root first
    dim_map: list[int | None] = list(range(len(shape_of(root))))
    shape = shape_of(root)
    for i, v in enumerate(chain):
        op = op_name(v.target)
        if op == "operator.getitem":
            if i > 0 and op_name(chain[i - 1].target) in SPLIT_OPS:
                continue  # the split op before it already mapped to this element
            # an element of a tuple-valued compute op: element 0 is the node's output; another
            # element is laid out like it only where every element is (same_layout_element)
            out_shape = shape_of(v)
            same = v.args[1] == 0 or (i == 0 and same_layout_element(root, out_shape))
            step = list(range(len(shape))) if same else [None] * len(shape)
        else:
            picked = chain[i + 1] if op in SPLIT_OPS and i + 1 < len(chain) else v
            out_shape = shape_of(picked)
            step = view_dim_map(op, v.args, shape, out_shape)
        dim_map = compose(dim_map, step)
        shape = out_shape
    return root, [op_name(v.target) for v in chain], dim_map


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
    role, _ = classify(ep)
    out = {}
    for n in ep.graph.nodes:
        if role[n] == "compute":
            roles = []
            for a in tensor_args(n):
                root, _, _ = resolve(a, role)
                r = role[root]
                roles.append("param" if r == "param" else "buffer" if r in ("buffer", "static") else "input")
            out[n.name] = roles
    return out
