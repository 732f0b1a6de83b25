"""Ops a meta trace records with dtypes their CPU kernels lack, rewritten to what the CPU path does.

Library code picks dtypes by device: HuggingFace's mixture-of-experts routing counts tokens per
expert with ``torch.histc(ids.float() if device.type in ("cpu", "mps") else ids.int(), ...)``
(``transformers/integrations/moe.py``), because ``histc`` has no integer kernel on the CPU. Exported
on the ``meta`` device, as capture and the executor export, that code takes the non-CPU branch,
and the graph then fails on CPU processes (``"histogram_cpu" not implemented for 'Int'``).

:func:`widen_integer_histc` gives every integer ``aten.histc`` a float32 operand and casts its
counts back to the integer dtype: the same counts (the values are whole numbers far below 2**24),
the dtypes the rest of the graph was traced with, and a kernel on every device. It runs in
:func:`tensoropt.capture.export_program`, so the planner and the executor see the same graph.

Example:
    >>> import torch
    >>> class Route(torch.nn.Module):
    ...     def forward(self, ids, x):
    ...         counts = torch.histc(ids.int(), bins=4, min=0, max=3)
    ...         return (x * counts.sum()).sum()
    >>> from tensoropt.capture.export import export_program
    >>> meta = (torch.zeros(4, dtype=torch.int64, device="meta"), torch.ones(2, device="meta"))
    >>> ep = export_program(Route(), meta)  # on meta: the integer histc is traced
    >>> histc = [n for n in ep.graph.nodes if n.target == torch.ops.aten.histc.default]
    >>> str(histc[0].args[0].meta["val"].dtype), str(next(iter(histc[0].users)).meta["val"].dtype)
    ('torch.float32', 'torch.int32')
    >>> float(ep.module()(torch.tensor([0, 1, 1, 3]), torch.ones(2)))  # and it runs on the CPU
    8.0
"""

from __future__ import annotations

import torch

_HISTC = torch.ops.aten.histc.default
_TO_COPY = torch.ops.aten._to_copy.default


def widen_integer_histc(ep: torch.export.ExportedProgram) -> int:
    """Rewrite each integer ``aten.histc`` of ``ep`` (in place) to count a float32 copy of its
    operand and cast the counts back; returns how many were rewritten.

    Example:
        >>> import torch
        >>> ep = torch.export.export(torch.nn.Flatten(), (torch.ones(2, 3),))
        >>> widen_integer_histc(ep)  # no histc: nothing to do
        0
    """
    graph = ep.graph_module.graph
    rewritten = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not _HISTC:
            continue
        operand = node.args[0]
        val = operand.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.dtype.is_floating_point or val.dtype.is_complex:
            continue
        int_dtype = val.dtype
        with graph.inserting_before(node):
            widened = graph.call_function(_TO_COPY, (operand,), {"dtype": torch.float32})
        widened.meta["val"] = _like(val, torch.float32)
        node.replace_input_with(operand, widened)
        out_val = node.meta.get("val")
        with graph.inserting_after(node):
            narrowed = graph.call_function(_TO_COPY, (node,), {"dtype": int_dtype})
        node.replace_all_uses_with(narrowed, delete_user_cb=lambda user, cast=narrowed: user is not cast)
        if isinstance(out_val, torch.Tensor):
            node.meta["val"] = _like(out_val, torch.float32)
            narrowed.meta["val"] = out_val
        rewritten += 1
    if rewritten:
        graph.lint()
        ep.graph_module.recompile()
    return rewritten


def _like(val: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``val`` (a fake or meta tensor) with another dtype, in ``val``'s own fake mode."""
    mode = getattr(val, "fake_mode", None)
    if mode is None:
        return torch.empty_like(val, dtype=dtype, device="meta")
    with mode:
        return torch.empty_like(val, dtype=dtype)
