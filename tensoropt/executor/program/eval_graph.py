"""The evaluation form of an exported training step: dropout off, batch norm on its running statistics.

The step is exported in training mode (the graph the plan prices: ``aten.dropout(x, p, True)``,
``aten.batch_norm(..., training=True, ...)``, attention's ``dropout_p``). :func:`eval_graph_module`
copies its graph with those flags turned to what ``model.eval()`` would have traced, keeping every
node's name, so the plan's placements apply unchanged; the forward-only step
(:meth:`tensoropt.ParallelModel.eval_step`) interprets the copy.

Example:
    >>> m = torch.nn.Sequential(torch.nn.Dropout(0.5))
    >>> gm = torch.fx.symbolic_trace(lambda x: torch.ops.aten.dropout.default(x, 0.5, True))
    >>> x = torch.ones(8)
    >>> torch.equal(eval_graph_module(gm)(x), x)
    True
"""

from __future__ import annotations

import copy

import torch
import torch.fx as fx

_aten = torch.ops.aten

TRAIN_FLAG_ARG = {
    _aten.dropout.default: (2, "train"),
    _aten.feature_dropout.default: (2, "train"),
    _aten.alpha_dropout.default: (2, "train"),
    _aten.feature_alpha_dropout.default: (2, "train"),
    _aten.native_dropout.default: (2, "train"),
    _aten.batch_norm.default: (5, "training"),
    _aten.instance_norm.default: (5, "use_input_stats"),
}
"""Op -> (position, keyword) of its training flag, set to False in evaluation."""

DROPOUT_P_ARG = {
    _aten.scaled_dot_product_attention.default: (4, "dropout_p"),
}
"""Op -> (position, keyword) of its dropout probability, set to 0 in evaluation."""


def _set_arg(node: fx.Node, position: int, keyword: str, value) -> bool:
    if keyword in node.kwargs:
        node.update_kwarg(keyword, value)
        return True
    if len(node.args) > position:
        node.update_arg(position, value)
        return True
    return False


def eval_graph_module(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` computing as in ``model.eval()``: dropout off, batch norm using (and leaving)
    its running statistics. Node names, placeholders and outputs are ``gm``'s.

    Example:
        >>> gm = torch.fx.symbolic_trace(lambda x: torch.ops.aten.dropout.default(x, 0.9, True))
        >>> [n.args[2] for n in eval_graph_module(gm).graph.nodes if n.op == "call_function"]
        [False]
    """
    copied = copy.deepcopy(gm)
    for node in copied.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target in TRAIN_FLAG_ARG:
            _set_arg(node, *TRAIN_FLAG_ARG[node.target], False)
        elif node.target in DROPOUT_P_ARG:
            _set_arg(node, *DROPOUT_P_ARG[node.target], 0.0)
    copied.recompile()
    return copied
