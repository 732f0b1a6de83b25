"""Sharding strategies DTensor lacks for elementwise ops that real models use, registered as pointwise.

torch 2.13's DTensor registers every op tagged ``pointwise``, but the backward of several
activations carries no tag: ``hardtanh_backward`` (ReLU6: MobileNetV2, EfficientNet),
``hardswish``/``hardswish_backward`` and ``hardsigmoid_backward`` (MobileNetV3), ``elu_backward``,
``leaky_relu_backward``, ``softplus_backward``, ``mish_backward``, ... A plan that splits such an
activation then failed in backward ("Operator aten.hardtanh_backward.default does not have a
sharding strategy registered"). Each is elementwise over operands of one shape, so DTensor's own
pointwise rule is exact for it: :func:`register_elementwise_rules` registers that rule for those
DTensor does not know yet. The executor's interpreter calls it when it is imported.

Group norm's backward: torch 2.13 registers a batch rule for ``native_group_norm`` and rewrites
its ``N, C, HxW`` arguments to the local shard's (``_adjust_group_norm_scalars``), but not for
``native_group_norm_backward``, whose strategy DTensor derives from the decomposition while the
kernel still gets the global ``N``: every batch-split group norm (PoolFormer) then failed in
backward ("Expected dY.numel() == N * C * HxW"), and one without affine parameters found no rule
at all (the decomposition fails on the absent weight). :func:`register_group_norm_backward_rule` gives it
the forward's rule (rows independent: every [N, ...] tensor split on the batch, the per-channel
weight replicated, its gradient and the bias's partial sums over the rows) and the same local
scalars. A split of the channels or the spatial dims is not offered: the statistics span both.

Example:
    >>> register_elementwise_rules() >= 0
    True
    >>> register_elementwise_rules()  # once registered, nothing left to do
    0
"""

from __future__ import annotations

from typing import Any

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


GROUP_NORM_BACKWARD = "native_group_norm_backward.default"
"""``native_group_norm_backward(grad_out, input, mean, rstd, weight?, N, C, HxW, group, output_mask)
-> (grad_input, grad_weight, grad_bias)``: the op :func:`register_group_norm_backward_rule` covers."""


def _group_norm_backward_strategy(op, args_schema: tuple[Any, ...], kwargs_schema: dict) -> list[list]:
    """The batch rule of group norm's backward on one mesh dim (the all-replicated rule is implied).

    Rows are normalised independently, so grad_out, input, mean and rstd ([N, group]) split on
    dim 0 give grad_input split on dim 0 and the per-channel grad_weight, grad_bias as partial
    sums of the rows; the weight is replicated.
    """
    from torch.distributed.tensor import Partial, Replicate
    from torch.distributed.tensor._ops.single_dim_strategy import _ShardingPlaceholder

    rows = _ShardingPlaceholder(0)
    rule = [rows, Partial(), Partial(), rows, rows, rows, rows]
    if args_schema[4] is not None:  # the weight (absent without affine)
        rule.append(Replicate())
    return [rule]


def register_group_norm_backward_rule() -> bool:
    """Register the batch rule and the local ``N, C, HxW`` of ``native_group_norm_backward`` (see the
    module); False where this torch already has a rule for it or lacks the private hooks.

    Example:
        >>> register_group_norm_backward_rule() in (True, False)
        True
        >>> register_group_norm_backward_rule()  # once registered, nothing left to do
        False
    """
    from torch.distributed.tensor import DTensor

    op = torch.ops.aten.native_group_norm_backward.default
    propagator = DTensor._op_dispatcher.sharding_propagator
    adjusters = getattr(propagator, "op_to_scalar_shape_adjuster", None)
    try:
        from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
        from torch.distributed.tensor._ops._math_ops import _adjust_group_norm_scalars
        from torch.distributed.tensor._ops.single_dim_strategy import register_single_dim_strategy
    except ImportError:  # another torch: its own registrations stand
        return False
    if adjusters is None or _known(op):
        return False
    register_single_dim_strategy(op, schema_info=RuntimeSchemaInfo(5))(_group_norm_backward_strategy)
    # the scalars follow the first tensor's (grad_out's) local shape, as in the forward
    adjusters[op] = _adjust_group_norm_scalars
    return True
