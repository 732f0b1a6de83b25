"""The counted tokens of a token-mean loss, per micro-batch: the loss scale of a pipelined step.

A last stage whose output is a plain-mean cross entropy (no class weights, no label smoothing)
returns the mean over its micro-batch's valid labels (those not ``ignore_index``). Scaling each
micro-batch's loss by ``1/m`` gives the whole batch's mean only when every micro-batch holds as
many valid labels; scaling it by ``n_i · dp / N`` (``n_i`` its valid labels, ``N`` the step's over
every micro-batch and data-parallel replica, ``dp`` the replicas whose gradients are then averaged)
gives it always: ``Σ_i n_i · mean_i / N`` is the mean over the whole batch.

:func:`label_counter` cuts from the stage graph the operators that make the loss's labels out of
the graph inputs (HF causal LMs shift them: pad with -100, slice) and counts the valid ones; it is
None where the loss is no plain-mean cross entropy or its labels depend on the received
activation (then the scale stays ``1/m``).

Example:
    >>> import torch
    >>> from torch import fx
    >>> g = fx.Graph()
    >>> x, y = g.placeholder("logits"), g.placeholder("labels")
    >>> _ = g.output(g.call_function(torch.ops.aten.cross_entropy_loss.default, (x, y)))
    >>> count = label_counter(fx.GraphModule({}, g))
    >>> count.input_names, count({"labels": torch.tensor([1, -100, 2])})
    (['labels'], 2)
"""

from __future__ import annotations

import torch
from torch import fx

_CE_ARGS = ("input", "target", "weight", "reduction", "ignore_index", "label_smoothing")
_MEAN = 1  # torch's Reduction.Mean


class LabelCounter:
    """The valid labels of a stage's loss from the graph inputs it reads (see :func:`label_counter`).

    Attributes:
        input_names: the graph inputs (keyword arguments of the stage) the count reads.
        ignore_index: the loss's ignored label.
    """

    def __init__(self, gm: fx.GraphModule, input_names: list[str], ignore_index: int):
        self.gm, self.input_names, self.ignore_index = gm, input_names, ignore_index

    def __call__(self, inputs: dict[str, torch.Tensor]) -> int:
        """The count of valid labels in ``inputs`` (by graph input name)."""
        return int(self.gm(*(inputs[n] for n in self.input_names)))

    def per_micro_batch(self, inputs: dict[str, torch.Tensor], micro_batches: int) -> list[int]:
        """Counts of the ``micro_batches`` equal row slices of ``inputs`` (the schedule's split).

        Example:
            >>> g = fx.Graph()
            >>> x, y = g.placeholder("logits"), g.placeholder("labels")
            >>> _ = g.output(g.call_function(torch.ops.aten.cross_entropy_loss.default, (x, y)))
            >>> label_counter(fx.GraphModule({}, g)).per_micro_batch(
            ...     {"labels": torch.tensor([[1, 2], [3, -100], [-100, -100], [4, 5]])}, 2)
            [3, 2]
        """
        chunks = {n: torch.tensor_split(inputs[n], micro_batches) for n in self.input_names}
        return [self({n: chunks[n][i] for n in self.input_names}) for i in range(micro_batches)]


def label_counter(module: fx.GraphModule) -> LabelCounter | None:
    """A counter of the valid labels of ``module``'s loss, or None (see the module docstring).

    Example:
        >>> g = fx.Graph()
        >>> x = g.placeholder("x")
        >>> _ = g.output(g.call_function(torch.ops.aten.sum.default, (x,)))
        >>> label_counter(fx.GraphModule({}, g)) is None
        True
    """
    out = next(n for n in module.graph.nodes if n.op == "output").args[0]
    if not isinstance(out, fx.Node) or out.target is not torch.ops.aten.cross_entropy_loss.default:
        return None
    bound = dict(zip(_CE_ARGS, out.args), **out.kwargs)
    if bound.get("weight") is not None or bound.get("reduction", _MEAN) != _MEAN \
            or bound.get("label_smoothing", 0.0):
        return None
    labels = bound["target"]
    needed, stack = set(), [labels]
    while stack:
        n = stack.pop()
        if n in needed:
            continue
        if n.op == "placeholder" and n.name == "received" or n.op == "get_attr" \
                or (n.op == "call_function" and n.target is out.target):
            return None  # the labels read the received activation or a parameter
        needed.add(n)
        stack.extend(n.all_input_nodes)
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    names = []
    for n in module.graph.nodes:
        if n not in needed:
            continue
        if n.op == "placeholder":
            names.append(str(n.target))
        env[n] = g.node_copy(n, env.__getitem__)
    ignore = int(bound.get("ignore_index", -100))
    valid = g.call_function(torch.ops.aten.ne.Scalar, (env[labels], ignore))
    g.output(g.call_function(torch.ops.aten.sum.default, (valid,)))
    return LabelCounter(fx.GraphModule(module, g), names, ignore)
