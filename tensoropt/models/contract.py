"""Your own model as a training step: the user's module and its loss in one module to capture.

A job's ``model.factory`` builds the user's ``nn.Module`` (called with exactly ``model.kwargs``);
:func:`training_step` wraps it with the job's ``model.loss`` into a :class:`TrainingStep` whose
forward takes the job's inputs (then ``targets``) as positional arguments named like them and
returns the scalar loss. ``torch.export`` captures that whole step, so the loss is planned and
split like any other operator, and the graph's input placeholders carry the inputs' names.

The user's parameters sit under ``model.`` in the step's state dict (``model.fc.weight``).

Example:
    >>> import torch
    >>> step = training_step(torch.nn.Linear(4, 3), {"input": {"shape": [4], "dtype": "float32",
    ...     "high": None}}, {"shape": [], "dtype": "int64", "high": 3}, "cross_entropy")
    >>> step.input_names
    ('input', 'targets')
    >>> x, y = step.example_inputs(2)
    >>> step(x, y).shape
    torch.Size([])
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

TARGETS = "targets"
"""The name of the targets' graph input (and of their key in a dataset sample)."""

IGNORE_INDEX = -100
"""Targets equal to this are left out of ``loss: cross_entropy`` (as in PyTorch and HuggingFace)."""


class ContractError(ValueError):
    """A model does not follow the job's contract; the message names the job key and the fix."""


def loss_of_output(output, where: str = "model") -> torch.Tensor:
    """The loss in what a ``loss: model`` forward returns.

    A scalar tensor; a mapping, dataclass or object (HuggingFace ``ModelOutput``) with a ``loss``
    entry; or a tuple/list whose first element is the loss.

    Example:
        >>> loss_of_output({"loss": torch.tensor(2.0), "logits": torch.ones(2)})
        tensor(2.)
        >>> loss_of_output((torch.tensor(1.5), torch.ones(3)))
        tensor(1.5000)
    """
    value = output
    if isinstance(output, Mapping):
        value = output.get("loss")
    elif isinstance(output, (tuple, list)):
        value = output[0] if output else None
    elif not isinstance(output, torch.Tensor):
        value = getattr(output, "loss", None)
    if not isinstance(value, torch.Tensor):
        raise ContractError(
            f"{where}.loss: model: forward returned {type(output).__name__} without a loss (a 'loss' entry "
            "is None or missing); pass the labels among model.inputs (HuggingFace computes the loss then), "
            "or use loss: cross_entropy with model.targets, or loss: package.module:function")
    if value.dim() != 0:
        raise ContractError(
            f"{where}.loss: model: forward returned a tensor of shape {list(value.shape)}, not a scalar "
            "loss; for logits use loss: cross_entropy with model.targets, or a loss function "
            "package.module:function")
    return value


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy of logits (class dim last) against integer targets (``ignore_index=-100``).

    ``[B, C]`` logits against ``[B]`` targets, or ``[B, T, V]`` against ``[B, T]`` (token level).

    Example:
        >>> cross_entropy(torch.zeros(2, 3, 4), torch.tensor([[0, 1, -100], [2, 3, 0]])).item() > 0
        True
    """
    if not isinstance(logits, torch.Tensor):
        raise ContractError(f"model.loss: cross_entropy: forward returned {type(logits).__name__}, not a "
                            "logits tensor; use loss: model (an output with a loss entry) or a loss function")
    if logits.dim() != targets.dim() + 1 or tuple(logits.shape[:-1]) != tuple(targets.shape):
        raise ContractError(
            f"model.loss: cross_entropy: logits of shape {list(logits.shape)} against targets of shape "
            f"{list(targets.shape)}; the logits need the targets' shape plus a class dim last "
            "(check model.targets.shape)")
    if logits.dim() == 2:
        return F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX)
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten(), ignore_index=IGNORE_INDEX)


def load_loss(loss: str) -> Callable:
    """The loss function of ``model.loss`` (``model``, ``cross_entropy`` or ``package.module:function``).

    Example:
        >>> load_loss("cross_entropy").__name__
        'cross_entropy'
    """
    if loss == "model":
        return lambda output, targets: loss_of_output(output)
    if loss == "cross_entropy":
        return cross_entropy
    from tensoropt.models.registry import load_factory

    try:
        return load_factory(loss)
    except ValueError as e:
        raise ContractError(f"model.loss: {e}") from None


class TrainingStep(nn.Module):
    """The user's model and its loss: ``forward(*inputs[, targets]) -> scalar loss``.

    Build it with :func:`training_step` (which gives ``forward`` the inputs' names).

    Example:
        >>> x_spec = {"shape": [2], "dtype": "float32", "high": None}
        >>> y_spec = {"shape": [1], "dtype": "float32", "high": None}
        >>> mse = "torch.nn.functional:mse_loss"
        >>> step = training_step(torch.nn.Linear(2, 1), {"input": x_spec}, y_spec, mse)
        >>> step(torch.ones(4, 2), torch.zeros(4, 1)).dim(), [k for k, _ in step.named_parameters()]
        (0, ['model.weight', 'model.bias'])
    """

    def __init__(self, model: nn.Module, inputs: dict | None, targets: dict | None, loss: str,
                 names: tuple[str, ...], keyword: bool):
        super().__init__()
        self.model = model
        self.inputs, self.targets, self.loss = inputs, targets, loss
        self.forward_names = names
        """The user forward's argument names, in the order the step takes them."""
        self.keyword = keyword
        """Whether the user's forward is called with keyword arguments (else positionally)."""
        self._loss_fn = load_loss(loss)

    @property
    def input_names(self) -> tuple[str, ...]:
        """The step's graph inputs in order: the forward's arguments, then ``targets`` when given."""
        return self.forward_names + ((TARGETS,) if self.targets is not None else ())

    def _forward(self, *args):
        n = len(self.forward_names)
        values = args[:n]
        out = self.model(**dict(zip(self.forward_names, values))) if self.keyword else self.model(*values)
        targets = args[n] if self.targets is not None else None
        if self.loss == "model":
            return loss_of_output(out)
        loss = self._loss_fn(out, targets)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise ContractError(f"model.loss: {self.loss} returned {type(loss).__name__} "
                                f"{list(getattr(loss, 'shape', []))}, not a scalar tensor")
        return loss

    def example_inputs(self, batch_size: int, device: str | torch.device = "cpu") -> tuple[torch.Tensor, ...]:
        """Example graph inputs of ``batch_size`` samples (values do not matter: capture traces shapes).

        From ``model.inputs`` (zeros), else the user model's ``example_inputs(batch_size)``; then
        the targets (zeros).
        """
        if self.inputs is not None:
            values = [_zeros(self.inputs[name], batch_size, device) for name in self.forward_names]
        else:
            values = [t.to(device) for t in _user_examples(self.model, batch_size)[1]]
        if self.targets is not None:
            values.append(_zeros(self.targets, batch_size, device))
        return tuple(values)


def training_step(model: nn.Module, inputs: dict | None, targets: dict | None, loss: str) -> TrainingStep:
    """Wrap ``model`` and its loss into one module whose forward names its arguments like the inputs.

    Args:
        model: the user's module.
        inputs: ``model.inputs`` (name -> ``{shape, dtype, high}``), or None: the model's
            ``example_inputs(batch_size)`` gives them (a dict: keyword arguments; a tuple:
            positional, named after forward's parameters).
        targets: ``model.targets`` or None.
        loss: ``model.loss``.

    Raises:
        ContractError: no inputs and no ``example_inputs`` method, or an input forward does not take.

    Example:
        >>> try:
        ...     training_step(torch.nn.Linear(2, 2), None, None, "model")
        ... except ContractError as e:
        ...     print(str(e)[:66])
        model.inputs: not given and Linear has no example_inputs(batch_siz
    """
    if inputs is not None:
        names, keyword = tuple(inputs), True
        _check_forward_takes(model, names)
    else:
        keyword, names = _example_names(model)
    forward = _named_forward(names, targets is not None)
    step_class = type("TrainingStep", (TrainingStep,), {"forward": forward})
    return step_class(model, inputs, targets, loss, names, keyword)


def _named_forward(names: tuple[str, ...], with_targets: bool):
    """A forward whose signature lists ``names`` (torch.export names the graph inputs after it)."""

    def forward(self, *args):
        return self._forward(*args)

    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [inspect.Parameter("self", kind)] + [inspect.Parameter(n, kind) for n in names]
    if with_targets:
        params.append(inspect.Parameter(TARGETS, kind))
    forward.__signature__ = inspect.Signature(params)
    return forward


def _check_forward_takes(model: nn.Module, names: tuple[str, ...]) -> None:
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    for name in names:
        if name not in params:
            raise ContractError(
                f"model.inputs.{name}: {type(model).__name__}.forward takes no argument {name!r} "
                f"(it takes {', '.join(params) or 'none'}); name model.inputs after forward's arguments")


def _user_examples(model: nn.Module, batch_size: int) -> tuple[bool, list[torch.Tensor], list[str] | None]:
    """(keyword call, tensors, their names when a dict) from the model's ``example_inputs``."""
    method = getattr(model, "example_inputs", None)
    if not callable(method):
        raise ContractError(
            f"model.inputs: not given and {type(model).__name__} has no example_inputs(batch_size) method; "
            "list forward's arguments under model.inputs, e.g. input_ids: {shape: [128], dtype: int64, "
            "high: 32000}")
    out = method(batch_size)
    if isinstance(out, Mapping):
        return True, list(out.values()), list(out)
    if isinstance(out, torch.Tensor):
        return False, [out], None
    return False, list(out), None


def _example_names(model: nn.Module) -> tuple[bool, tuple[str, ...]]:
    """(keyword call, names) of the example inputs: the dict's keys, else forward's positional names."""
    keyword, values, keys = _user_examples(model, 1)
    if keys is not None:
        return keyword, tuple(keys)
    try:
        params = [p for p in inspect.signature(model.forward).parameters.values()
                  if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params[:len(values)]]
    names += [f"input{i}" for i in range(len(names), len(values))]
    return keyword, tuple(names)


def _zeros(spec: dict, batch_size: int, device) -> torch.Tensor:
    return torch.zeros((batch_size, *spec["shape"]), dtype=getattr(torch, spec["dtype"]), device=device)


__all__ = ["ContractError", "IGNORE_INDEX", "TARGETS", "TrainingStep", "cross_entropy",
           "load_loss", "loss_of_output", "training_step"]
