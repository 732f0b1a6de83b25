"""Capture: model -> torch.export program -> OpGraph.

Example:
    >>> import torch
    >>> from tensoropt.capture import capture
    >>> g = capture(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU()), (torch.randn(2, 4),))
    >>> [g.nx.nodes[n]["kind"] for n in g.compute_nodes()]
    ['linear', 'elementwise']
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from tensoropt.capture.graph import OpGraph

__all__ = [
    "capture",
    "export_program",
    "operand_roles",
    "tensor_args",
    "OpGraph",
    "TraceError",
    "CaptureWarning",
]

_LAZY = {
    "export_program": "tensoropt.capture.export",
    "TraceError": "tensoropt.capture.export",
    "operand_roles": "tensoropt.capture.fxroles",
    "tensor_args": "tensoropt.capture.fxroles",
    "OpGraph": "tensoropt.capture.graph",
    "CaptureWarning": "tensoropt.capture.graph",
    "build_graph": "tensoropt.capture.graph",
}
"""The package's names, imported when first used: a module that needs one light part of capture
(``tensoropt.capture.ops``, ``.fingerprint``) does not load torch.export's wrapper nor networkx."""


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tensoropt.capture' has no attribute {name!r}")


def capture(model: torch.nn.Module, example_inputs: Sequence) -> OpGraph:
    """Capture the training-step operator graph of ``model`` on ``example_inputs``.

    Args:
        model: the module (exported in train mode; may live on the ``meta`` device).
        example_inputs: positional forward inputs. For a training plan, pass the labels too and
            let the forward return the loss (the zoo models do).

    Returns:
        The :class:`OpGraph` (``graph.nx`` is the networkx DiGraph, ``graph.program`` the export).

    Raises:
        TraceError: torch.export cannot trace the model (message says why and what to do).

    Example:
        >>> import torch
        >>> g = capture(torch.nn.Linear(4, 2), (torch.randn(3, 4),))
        >>> g.nx.nodes["linear"]["flops"]
        48
    """
    from tensoropt.capture.export import export_program
    from tensoropt.capture.graph import build_graph

    return build_graph(export_program(model, example_inputs))


class _CallableCaptureModule(type(sys.modules[__name__])):
    """Makes ``tensoropt.capture(model, inputs)`` work although ``capture`` is also a subpackage.

    Importing any ``tensoropt.capture.*`` module binds the *package* to the attribute
    ``tensoropt.capture``, shadowing the lazy function; calling the package forwards to
    :func:`capture`, so both spellings of the public API behave the same.
    """

    def __call__(self, model: torch.nn.Module, example_inputs: Sequence) -> OpGraph:
        return capture(model, example_inputs)


sys.modules[__name__].__class__ = _CallableCaptureModule
