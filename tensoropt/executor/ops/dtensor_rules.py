"""Sharding strategies DTensor lacks for elementwise ops that real models use, registered as pointwise.

torch 2.13's DTensor registers every op tagged ``pointwise``, but the backward of several
activations carries no tag: ``hardtanh_backward`` (ReLU6: MobileNetV2, EfficientNet),
``hardswish``/``hardswish_backward`` and ``hardsigmoid_backward`` (MobileNetV3), ``elu_backward``,
``leaky_relu_backward``, ``softplus_backward``, ``mish_backward``, ... A plan that splits such an
activation then failed in backward ("Operator aten.hardtanh_backward.default does not have a
sharding strategy registered"). Each is elementwise over operands of one shape, so DTensor's own
pointwise rule is exact for it: :func:`register_elementwise_rules` registers that rule for those
DTensor does not know yet. The executor's interpreter calls it when it is imported.

Example:
    >>> register_elementwise_rules() >= 0
    True
    >>> register_elementwise_rules()  # once registered, nothing left to do
    0
"""

from __future__ import annotations

import torch

ELEMENTWISE_OPS = (
    "hardtanh_backward.default", "hardswish.default", "hardswish_backward.default",
    "hardsigmoid_backward.default", "elu_backward.default", "leaky_relu_backward.default",
    "softplus_backward.default", "mish_backward.default", "log_sigmoid_backward.default",
    "softshrink_backward.default", "hardshrink_backward.default",
)
"""aten ops (``name.overload``) elementwise over same-shape tensor operands, scalars beside."""


def _known(op) -> bool:
    from torch.distributed.tensor import DTensor

    propagator = DTensor._op_dispatcher.sharding_propagator
    tables = ("op_strategy_funcs", "op_single_dim_strategy_funcs", "op_to_rules")
    return any(op in getattr(propagator, table, {}) for table in tables)


def register_elementwise_rules() -> int:
    """Register DTensor's pointwise strategy for each :data:`ELEMENTWISE_OPS` op it lacks; returns
    how many were registered (0 where this torch has them all, or has no such private hook).

    Example:
        >>> register_elementwise_rules() in range(len(ELEMENTWISE_OPS) + 1)
        True
    """
    try:
        from torch.distributed.tensor._ops._pointwise_ops import _register_single_dim_pointwise
    except ImportError:  # another torch: its own registrations stand
        return 0
    registered = 0
    for name in ELEMENTWISE_OPS:
        packet, overload = name.rsplit(".", 1)
        op = getattr(getattr(torch.ops.aten, packet, None), overload, None)
        if op is None or _known(op):
            continue
        _register_single_dim_pointwise(op)
        registered += 1
    return registered
