"""Capture: model -> torch.export program -> OpGraph.

Example:
    >>> import torch
    >>> from tensoropt.capture import capture
    >>> g = capture(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU()), (torch.randn(2, 4),))
    >>> [g.nx.nodes[n]["kind"] for n in g.compute_nodes()]
    ['linear', 'elementwise']
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import torch

from tensoropt.capture.export import TraceError, export_program
from tensoropt.capture.fxroles import operand_roles, tensor_args
from tensoropt.capture.graph import CaptureWarning, OpGraph, build_graph

__all__ = [
    "capture",
    "export_program",
    "operand_roles",
    "tensor_args",
    "OpGraph",
    "TraceError",
    "CaptureWarning",
]


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
