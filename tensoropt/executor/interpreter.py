"""Runs an exported graph on DTensors, node by node, exactly as a plan lays it out.

For each node the plan names (a compute node), :class:`PlanInterpreter`

1. redistributes each tensor operand to the configuration's input layout (parameters to the
   configuration's parameter layout),
2. runs the op (through :mod:`tensoropt.executor.explicit_ops` where DTensor is wrong),
3. checks the placement DTensor produced against the configuration's raw output layout
   (``output`` with ``"P"`` on ``partial_axes``) and raises :class:`PlacementMismatch` naming
   the node when they differ, instead of letting a silent all-gather or a wrong shard through,
4. reduces the partial axes (Partial -> the configuration's output layout).

Nodes the plan does not name (views folded into edges, ``getitem``, factory ops) run on the
DTensors as they come; a plain tensor a node creates is wrapped as a replicated DTensor.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from torch.distributed.tensor import DeviceMesh, DTensor, Replicate

from tensoropt.configspace.configuration import Configuration
from tensoropt.executor import explicit_ops
from tensoropt.executor.placements import normalise, raw_output_layout, to_layout, to_placements
from tensoropt.executor.program import Signature, op_name, packet_name, tensor_args

_CONV_ARGS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")


class PlacementMismatch(RuntimeError):
    """DTensor produced a placement other than the one the plan names."""


class PlanInterpreter(fx.Interpreter):
    """An ``fx.Interpreter`` over an exported program's graph that follows a plan.

    Args:
        gm: the exported program's ``graph_module`` (placeholders for parameters, buffers,
            constants and user inputs).
        sig: placeholder roles (:func:`tensoropt.executor.program.signature`).
        placements: node name -> Configuration (empty for a plain single-device run).
        mesh: the DeviceMesh, or None for a plain run.

    Example:
        >>> out = PlanInterpreter(ep.graph_module, sig, placements, mesh).run(*values)  # doctest: +SKIP
    """

    def __init__(self, gm: fx.GraphModule, sig: Signature, placements: dict[str, Configuration],
                 mesh: DeviceMesh | None):
        super().__init__(gm)
        self.sig = sig
        self.placements = placements
        self.mesh = mesh
        self.state_keys = {**sig.params, **sig.buffers}

    def run_node(self, n: fx.Node) -> Any:
        if self.mesh is None or n.op != "call_function":
            return super().run_node(n)
        config = self.placements.get(n.name)
        if config is None:
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            return self._wrap_plain(self.call_function(n.target, args, kwargs))
        args, kwargs = self._lay_out_operands(n, config)
        out, bias = self._compute(n, args, kwargs)
        return self._check_and_reduce(n, config, out, bias)

    # -- operands ---------------------------------------------------------------------------

    def _lay_out_operands(self, n: fx.Node, config: Configuration):
        """Fetch ``n``'s arguments with every tensor operand laid out as ``config`` says."""
        operands = tensor_args(n)
        activations = [a for a in operands if a.name not in self.state_keys]
        if len(config.inputs) != len(activations):
            raise PlacementMismatch(
                f"node {n.name!r} ({op_name(n)}): the plan gives {len(config.inputs)} input layouts "
                f"but the node reads {len(activations)} tensor operands "
                f"({[a.name for a in activations]}); was the plan made for this model?"
            )
        param_layouts = dict(config.params)
        act_layouts = iter(config.inputs)
        operand_set = set(operands)

        def load(a: fx.Node):
            value = self.env[a]
            if a not in operand_set or not isinstance(value, torch.Tensor):
                return value
            if a.name in self.state_keys:
                return self._redistribute(n, value, param_layouts.get(self.state_keys[a.name]))
            return self._redistribute(n, value, next(act_layouts))

        return fx.node.map_arg(n.args, load), fx.node.map_arg(n.kwargs, load)

    def _redistribute(self, n: fx.Node, value: torch.Tensor, target) -> torch.Tensor:
        if not isinstance(value, DTensor):
            value = self._wrap_plain(value)
        if target is None:
            return value
        target = normalise(target, value.dim())
        if len(target) != self.mesh.ndim:
            raise PlacementMismatch(
                f"node {n.name!r} ({op_name(n)}): layout {target} has {len(target)} axes, "
                f"the mesh has {self.mesh.ndim}"
            )
        current = to_layout(value.placements, value.dim())
        if current == tuple(target):
            return value
        if "P" in target:
            raise PlacementMismatch(
                f"node {n.name!r} ({op_name(n)}): an operand is {current} but the plan asks for the "
                f"partial layout {tuple(target)}, which cannot be produced by redistribution"
            )
        return value.redistribute(self.mesh, to_placements(target))

    def _wrap_plain(self, out):
        if isinstance(out, torch.Tensor) and not isinstance(out, DTensor) and self.mesh is not None:
            return DTensor.from_local(out, self.mesh, [Replicate()] * self.mesh.ndim, run_check=False)
        return out

    # -- compute and check ------------------------------------------------------------------

    def _compute(self, n: fx.Node, args, kwargs):
        """Run the op; returns (raw output, bias to add after the partial sum is reduced)."""
        name = packet_name(n)
        if name == "conv2d":
            bound = dict(zip(_CONV_ARGS, args), **kwargs)
            rest = {k: bound[k] for k in _CONV_ARGS[3:] if k in bound}
            return explicit_ops.conv2d(n.name, bound["input"], bound["weight"], **rest), bound.get("bias")
        if name == "scaled_dot_product_attention":
            return explicit_ops.sdpa(n.name, *args, **kwargs), None
        if name == "batch_norm":
            return explicit_ops.batch_norm(n.name, *args, **kwargs), None
        if name == "cross_entropy_loss":
            return explicit_ops.cross_entropy(n.name, n.target, *args, **kwargs), None
        return self.call_function(n.target, args, kwargs), None

    def _check_and_reduce(self, n: fx.Node, config: Configuration, out, bias):
        first = out[0] if isinstance(out, (tuple, list)) else out
        if isinstance(first, torch.Tensor):
            if not isinstance(first, DTensor):
                first = self._wrap_plain(first)
            expected = normalise(raw_output_layout(config), first.dim())
            actual = to_layout(first.placements, first.dim())
            if actual != expected:
                raise PlacementMismatch(
                    f"node {n.name!r} ({op_name(n)}, configuration {config.label!r}): expected output "
                    f"placement {expected}, DTensor produced {actual}"
                )
            target = normalise(tuple(config.output), first.dim())
            if actual != target:
                first = first.redistribute(self.mesh, to_placements(target))
            if bias is not None:
                first = explicit_ops.add_bias(first, bias)
        if isinstance(out, tuple):
            return (first, *out[1:])
        if isinstance(out, list):
            return [first, *out[1:]]
        return first
