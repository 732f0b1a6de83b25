"""Ops that carry no data (runtime assertions, symbolic range constraints), dropped at capture.

``torch.export`` records checks such as ``aten._assert_tensor_metadata`` (a ``.to(dtype)`` in
HuggingFace code), ``aten._assert_scalar`` and ``aten.sym_constrain_range_for_size``. They compute
nothing the step uses, DTensor has no sharding strategy for them, and the planner has nothing to
split: :func:`drop_no_data_ops` erases them from the exported graph right after export, so neither
the OpGraph, the plan nor the executor ever sees them (everyone exports through
``tensoropt.capture.export_program``).
"""

from __future__ import annotations

from collections import Counter

import torch

NO_DATA_OPS = frozenset(
    "aten." + s
    for s in (
        "_assert_tensor_metadata.default _assert_scalar.default _assert_async.default _assert_async.msg "
        "_functional_assert_async.msg _functional_assert_scalar.default "
        "sym_constrain_range.default sym_constrain_range_for_size.default "
        "_functional_sym_constrain_range.default _functional_sym_constrain_range_for_size.default "
        "_print.default"
    ).split()
)
"""Ops whose only effect is a check (or a dependency token between checks)."""


def drop_no_data_ops(ep: torch.export.ExportedProgram) -> dict[str, int]:
    """Erase every :data:`NO_DATA_OPS` node nothing reads from ``ep``'s graph (in place).

    Checks chained through dependency tokens go too (the graph is walked backwards). The counts
    are also kept in ``ep.graph_module.meta["dropped_ops"]``.

    Returns:
        op name -> how many nodes were dropped.

    Example:
        >>> import torch
        >>> from tensoropt.capture.export import export_program
        >>> class Cast(torch.nn.Module):
        ...     def forward(self, x):
        ...         return x.to(torch.float32) * 2
        >>> ep = export_program(Cast(), (torch.randn(2, 3, dtype=torch.float64),))
        >>> ep.graph_module.meta["dropped_ops"]
        {'aten._assert_tensor_metadata.default': 1}
        >>> any("assert" in str(n.target) for n in ep.graph.nodes)
        False
    """
    graph = ep.graph_module.graph
    dropped: Counter[str] = Counter()
    for node in reversed(list(graph.nodes)):
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        name = str(node.target)
        if name in NO_DATA_OPS and not node.users:
            graph.erase_node(node)
            dropped[name] += 1
    if dropped:
        graph.lint()
        ep.graph_module.recompile()
    ep.graph_module.meta["dropped_ops"] = dict(dropped)
    return dict(dropped)
