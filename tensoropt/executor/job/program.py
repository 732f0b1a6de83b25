"""The exported program the executor interprets, and how its nodes map onto a plan.

All exporting goes through :func:`export_program`, which uses the capture engineer's
``tensoropt.capture.export_program`` when it is present, so node names agree with the plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx


def export_program(model: torch.nn.Module, example_inputs: tuple) -> torch.export.ExportedProgram:
    """Export ``model`` exactly as capture does (same node names as the plan).

    Example:
        >>> ep = export_program(torch.nn.Linear(2, 2), (torch.ones(1, 2),))
        >>> [n.name for n in ep.graph.nodes if n.op == "call_function"]
        ['linear']
    """
    try:
        from tensoropt.capture import export_program as capture_export
    except ImportError:
        capture_export = None
    if capture_export is not None:
        return capture_export(model, example_inputs)
    return torch.export.export(model, tuple(example_inputs))


def op_name(node: fx.Node) -> str:
    """``"aten.linear.default"`` style name of a call_function node (``str(target)`` otherwise).

    Example:
        >>> g = fx.Graph(); x = g.placeholder("x")
        >>> op_name(g.call_function(torch.ops.aten.relu.default, (x,)))
        'aten.relu.default'
    """
    from tensoropt.capture.graph import op_name as capture_op_name

    return capture_op_name(node.target)


def packet_name(node: fx.Node) -> str:
    """The aten overload packet (``"linear"``) of a call_function node, else ``""``."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target.overloadpacket.__name__
    return getattr(target, "__name__", "")


@dataclass(frozen=True)
class Signature:
    """Where each placeholder of the exported graph comes from.

    Attributes:
        params: placeholder name -> parameter state-dict key.
        buffers: placeholder name -> buffer state-dict key.
        constants: placeholder name -> lifted constant key.
        user_inputs: user-input placeholder names in call order.
        buffer_mutations: output node name -> buffer key it writes back.
    """

    params: dict[str, str]
    buffers: dict[str, str]
    constants: dict[str, str]
    user_inputs: tuple[str, ...]
    buffer_mutations: dict[str, str]


def signature(ep: torch.export.ExportedProgram) -> Signature:
    """Read the placeholder roles from an exported program.

    Example:
        >>> sig = signature(export_program(torch.nn.Linear(2, 2), (torch.ones(1, 2),)))
        >>> sig.params, sig.user_inputs
        ({'p_weight': 'weight', 'p_bias': 'bias'}, ('input',))
    """
    gs = ep.graph_signature
    constants = dict(gs.inputs_to_lifted_tensor_constants)
    constants.update(getattr(gs, "inputs_to_lifted_custom_objs", {}) or {})
    return Signature(
        params=dict(gs.inputs_to_parameters),
        buffers=dict(gs.inputs_to_buffers),
        constants=constants,
        user_inputs=tuple(gs.user_inputs),
        buffer_mutations=dict(gs.buffers_to_mutate),
    )


def arg_nodes(node: fx.Node) -> list[fx.Node]:
    """Every fx node in a node's args then kwargs values (lists and tuples flattened), in order.

    Capture's own walk, so the order is exactly that of the OpGraph node's ``operands``.

    Example:
        >>> g = fx.Graph(); x = g.placeholder("x")
        >>> [a.name for a in arg_nodes(g.call_function(torch.ops.aten.cat.default, ([x, x],)))]
        ['x', 'x']
    """
    from tensoropt.capture.graph import tensor_args as capture_tensor_args

    return capture_tensor_args(node)


def lazy_views(ep: torch.export.ExportedProgram, placements: dict) -> set[str]:
    """Names of the view nodes capture folds into edges (views of data or parameters, not in the plan).

    Example:
        >>> ep = export_program(torch.nn.Flatten(), (torch.ones(2, 3, 4),))
        >>> sorted(lazy_views(ep, {}))
        ['flatten']
    """
    from tensoropt.capture.views import VIEW_OPS as CAPTURE_VIEW_OPS

    sig = signature(ep)
    dynamic: set[str] = set(sig.params) | set(sig.user_inputs)
    out = set()
    for n in ep.graph.nodes:
        if n.op != "call_function":
            continue
        if any(a.name in dynamic for a in arg_nodes(n)):
            dynamic.add(n.name)
            if op_name(n) in CAPTURE_VIEW_OPS and n.name not in placements:
                out.add(n.name)
    return out


def tensor_args(node: fx.Node) -> list[fx.Node]:
    """The fx nodes a node reads as tensor operands, in argument order (duplicates kept).

    Example:
        >>> g = fx.Graph(); x = g.placeholder("x")
        >>> [a.name for a in tensor_args(g.call_function(torch.ops.aten.mul.Tensor, (x, x)))]
        ['x', 'x']
    """
    out: list[fx.Node] = []
    fx.node.map_arg((node.args, node.kwargs), lambda a: out.append(a))
    return [a for a in out if _is_tensor_node(a)]


def _is_tensor_node(n: fx.Node) -> bool:
    val = n.meta.get("val")
    if val is None:
        return n.op == "placeholder"
    return isinstance(val, torch.Tensor)
