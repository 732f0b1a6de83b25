"""Export a model with ``torch.export`` (training IR, aten level) with a clear error on failure.

Everyone (capture, executor) exports through :func:`export_program` so that fx node names,
and therefore OpGraph node names and plan keys, agree.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch

from tensoropt.capture.assertions import drop_no_data_ops
from tensoropt.capture.constants import ConstantError, evaluate_forward_constants
from tensoropt.capture.cpu_kernels import widen_integer_histc
from tensoropt.capture.trace_advice import advice, clean_reason, trace_kind


class TraceError(RuntimeError):
    """``torch.export`` could not trace the model; the message says why and what to do.

    ``kind`` is what the cause was (:func:`tensoropt.capture.trace_advice.trace_kind`: ``size``,
    ``shapes``, ``data``, ``other``; ``constant`` for a constant made in forward with no value).
    """

    def __init__(self, message: str, kind: str = "other"):
        super().__init__(message)
        self.kind = kind




def export_program(model: torch.nn.Module, example_inputs: Sequence) -> torch.export.ExportedProgram:
    """Export ``model`` in train mode at aten level (``torch.export``, non-strict, training IR).

    Args:
        model: the module; it is put in train mode (the plan is a training plan).
        example_inputs: positional inputs of ``model.forward`` (a tuple or list). Tensors may live
            on the ``meta`` device, which exports without allocating memory.

    Returns:
        The ``torch.export.ExportedProgram``, without the ops that carry no data (runtime
        assertions: :func:`tensoropt.capture.assertions.drop_no_data_ops`). Nodes carry no
        ``meta["stack_trace"]`` (:func:`_no_stack_traces`): nothing reads it, and recording it
        took a third of the export of Llama-3-8B's 32 layers.

    Raises:
        TraceError: the model cannot be traced; the message carries torch's reason and advice.

    Example:
        >>> import torch
        >>> ep = export_program(torch.nn.Linear(4, 2), (torch.randn(3, 4),))
        >>> [n.name for n in ep.graph.nodes if n.op == "call_function"]
        ['linear']
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"capture expects a torch.nn.Module, got {type(model).__name__}")
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    args = tuple(example_inputs)
    was_training = model.training
    model.train()
    try:
        with _no_stack_traces():
            ep = _export(model, args)
            evaluate_forward_constants(ep, model, args, _export)
    except ConstantError as err:
        raise TraceError(f"cannot capture {type(model).__name__}: {err}", "constant") from None
    except Exception as err:  # torch raises many types (UserError, GuardOnDataDependent, ...)
        kind = trace_kind(err)
        short = "\n  ".join(clean_reason(str(err))) or type(err).__name__
        raise TraceError(
            f"torch.export could not trace {type(model).__name__}: {type(err).__name__}:\n"
            f"  {short}\n{advice(kind)}", kind
        ) from err
    finally:
        model.train(was_training)
    drop_no_data_ops(ep)
    widen_integer_histc(ep)
    return ep


def _export(model: torch.nn.Module, args: tuple) -> torch.export.ExportedProgram:
    """``torch.export.export`` as :func:`export_program` calls it (non-strict), its fake-tensor
    logger quiet: a failing operator's traceback is torch's log record, the error is raised anyway."""
    import logging

    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        return torch.export.export(model, args, strict=False)
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def _no_stack_traces():
    """Export without recording each fx node's Python stack (``torch.fx.config``), then restore.

    torch extracts and symbolises the user's stack for every traced operator (``linecache`` reads
    for each frame): seconds on a large model for a ``meta["stack_trace"]`` that neither the
    OpGraph nor the executor reads. The exported graph, node names and metadata used are the same
    (tests/capture/test_export_speed.py).

    Example:
        >>> import torch.fx.config
        >>> with _no_stack_traces():
        ...     torch.fx.config.do_not_emit_stack_traces
        True
    """
    import torch.fx.config

    before = torch.fx.config.do_not_emit_stack_traces
    torch.fx.config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        torch.fx.config.do_not_emit_stack_traces = before
