"""Give a value to the tensor constants a model makes in ``forward`` when it is exported on meta.

A tensor that ``forward`` builds from Python data (``torch.tensor(finfo.min, device=x.device)``
for a mask value, a list index ``qkv[..., [-2]]``, a scaling factor) is lifted by ``torch.export``
as a constant (``<module path>.lifted_tensor_<n>``). Exported on the ``meta`` device, as capture
and the executor do to allocate nothing, that constant is a meta tensor: it has a shape but no
value, and the executor could not run it.

:func:`evaluate_forward_constants` gives those constants their values without materialising the
model: it exports the same module once more with every meta parameter, buffer, tensor attribute
and input replaced by a *fake* CPU tensor (``FakeTensorMode``: shapes and dtypes, no storage). A
constant made from Python data is then created on the CPU for real, so the second export holds
its value; nothing of the model's size is allocated. A constant whose value cannot be had that way
(its producer needs the weights' values) is a :class:`ConstantError` naming the module and the
model's source line that made it.

Example:
    >>> import torch
    >>> class Masked(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.lin = torch.nn.Linear(4, 4)
    ...     def forward(self, x):
    ...         low = torch.tensor(-1e4, device=x.device)  # made in forward: a lifted constant
    ...         return torch.where(x > 0, self.lin(x), low).sum()
    >>> with torch.device("meta"):
    ...     model = Masked()
    >>> from tensoropt.capture.export import export_program
    >>> ep = export_program(model, (torch.empty(2, 4, device="meta"),))
    >>> [(k, float(v)) for k, v in ep.constants.items()]
    [('lifted_tensor_0', -10000.0)]
"""

from __future__ import annotations

import contextlib
import linecache
import re
from collections.abc import Iterator, Sequence

import torch

_MADE_IN_FORWARD = re.compile(r"(^|\.)(lifted_tensor|_tensor_constant)_?\d+$")


class ConstantError(RuntimeError):
    """A tensor constant made in ``forward`` has no value when the model is exported on meta."""


def forward_constants_on_meta(ep: torch.export.ExportedProgram) -> list[str]:
    """Keys of ``ep``'s lifted tensor constants that ``forward`` made and that have no value (meta).

    A constant named after a module attribute (a non-persistent buffer, a plain tensor attribute)
    is not listed: its value is the attribute's, which whoever built the module holds.

    Example:
        >>> import torch
        >>> class M(torch.nn.Module):
        ...     def forward(self, x):
        ...         return x + torch.tensor([1.0, 2.0], device=x.device)
        >>> from tensoropt.capture.export import export_program
        >>> ep = export_program(M(), (torch.empty(3, 2, device="meta"),))
        >>> forward_constants_on_meta(ep)  # export_program has already evaluated it
        []
    """
    return [key for key, value in ep.constants.items()
            if isinstance(value, torch.Tensor) and value.is_meta and _MADE_IN_FORWARD.search(key)]


def evaluate_forward_constants(ep: torch.export.ExportedProgram, model: torch.nn.Module,
                               args: Sequence, export) -> int:
    """Give every meta constant ``forward`` made in ``ep`` its CPU value, in place; returns how many.

    Args:
        ep: the program exported from ``model`` on ``args`` (meta tensors).
        model: the module (parameters and buffers may be on meta; they are not changed).
        args: the example inputs ``ep`` was exported on.
        export: ``export(model, args) -> ExportedProgram``, the exporter that made ``ep``.

    Raises:
        ConstantError: a constant keeps no value (its producer reads a tensor's values, or the
            model cannot be exported on CPU stand-ins); names the module and the source line.

    Example:
        >>> # export_program calls it; see the module's example
        >>> evaluate_forward_constants(ep, model, args, export_program)  # doctest: +SKIP
        1
    """
    keys = forward_constants_on_meta(ep)
    if not keys:
        return 0
    try:
        with fake_cpu_stand_ins(model) as fake_mode:
            cpu_args = tuple(_fake_cpu(a, fake_mode) for a in args)
            values = export(model, cpu_args).constants
    except Exception as err:  # torch raises many types; the model exported on meta, so say which constant
        first_line = (str(err).strip().splitlines() or [""])[0][:200]
        reason = f"exporting it on CPU stand-ins failed: {type(err).__name__}: {first_line}"
        raise ConstantError(_message(keys[0], model, args, export, reason)) from err
    for key in keys:
        value = values.get(key)
        meta = ep.constants[key]
        if (not isinstance(value, torch.Tensor) or value.is_meta or _is_fake(value)
                or value.shape != meta.shape or value.dtype != meta.dtype):
            raise ConstantError(_message(key, model, args, export, "it stays without a value on CPU "
                                         "stand-ins of the model (made on the meta device, or from the "
                                         "contents of a tensor that has none before the weights are made)"))
        ep.constants[key] = value
    return len(keys)


@contextlib.contextmanager
def fake_cpu_stand_ins(model: torch.nn.Module) -> Iterator[object]:
    """Inside, every meta parameter, buffer and tensor attribute of ``model`` is a fake CPU tensor.

    Yields the ``FakeTensorMode`` that owns them (make the inputs in it too). Nothing is allocated;
    the module's own tensors are put back on exit.

    Example:
        >>> import torch
        >>> with torch.device("meta"):
        ...     lin = torch.nn.Linear(2, 2)
        >>> with fake_cpu_stand_ins(lin):
        ...     lin.weight.device.type, lin.weight.is_meta
        ('cpu', False)
        >>> lin.weight.is_meta
        True
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    saved: list[tuple[dict, str, object]] = []
    stand_in: dict[int, torch.Tensor] = {}  # one stand-in per tensor (tied weights stay tied)

    def swap(table: dict, name: str, value) -> None:
        if not isinstance(value, torch.Tensor) or not value.is_meta:
            return
        if id(value) not in stand_in:
            fake = _fake_cpu(value, fake_mode)
            if isinstance(value, torch.nn.Parameter):
                fake = torch.nn.Parameter(fake, requires_grad=value.requires_grad)
            stand_in[id(value)] = fake
        saved.append((table, name, value))
        table[name] = stand_in[id(value)]

    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, value in list(table.items()):
                swap(table, name, value)
        for name, value in list(vars(module).items()):
            swap(vars(module), name, value)
    try:
        yield fake_mode
    finally:
        for table, name, value in reversed(saved):
            table[name] = value


def _fake_cpu(value, fake_mode):
    """A fake CPU tensor shaped like a meta ``value`` (other values unchanged)."""
    if not isinstance(value, torch.Tensor) or not value.is_meta:
        return value
    with fake_mode:
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="cpu")


def _is_fake(value: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(value, FakeTensor)


def _message(key: str, model: torch.nn.Module, args: Sequence, export, reason: str) -> str:
    """The module that made constant ``key``, the model's source line, why, and the way out."""
    path = key.rsplit(".", 1)[0] if "." in key else ""
    try:
        module = model.get_submodule(path)
        where = f"module {path or '<root>'!r} ({type(module).__module__}.{type(module).__name__})"
    except AttributeError:
        where = f"module {path or '<root>'!r}"
    line = _source_line(key, model, args, export)
    return (f"tensor constant {key!r} made in forward by {where}{line} has no value: {reason}. The "
            "planner builds models without their weights; a constant computed from Python values "
            "(numbers, shapes, lists) is evaluated, one computed from a tensor's contents is not. Make "
            "that value from Python numbers or shapes, or keep it in a buffer (register_buffer) in your "
            "own model; in a library's model, it is not supported (docs/user-guide.md, 'When a model is "
            "not supported')")


def _source_line(key: str, model: torch.nn.Module, args: Sequence, export) -> str:
    """`` at FILE:LINE (`code`)``: where the model's code uses constant ``key`` ('' if unknown)."""
    import torch.fx.config

    before = torch.fx.config.do_not_emit_stack_traces
    torch.fx.config.do_not_emit_stack_traces = False
    try:
        ep = export(model, args)
    except Exception:  # only for a better message: without it the message still names the module
        return ""
    finally:
        torch.fx.config.do_not_emit_stack_traces = before
    placeholder = next((n for n, k in ep.graph_signature.inputs_to_lifted_tensor_constants.items()
                        if k == key), None)
    for node in ep.graph.nodes:
        if node.op == "placeholder" and node.name == placeholder:
            for user in node.users:
                frame = _model_frame(user.meta.get("stack_trace") or "")
                if frame:
                    return frame
    return ""


def _model_frame(stack_trace: str) -> str:
    """`` at FILE:LINE (`code`)`` of the innermost frame outside torch in an fx stack trace."""
    frames = re.findall(r'File "([^"]+)", line (\d+)', stack_trace)
    for path, line in reversed(frames):
        if "/torch/" in path:
            continue
        code = linecache.getline(path, int(line)).strip()
        return f" at {path}:{line}" + (f" (`{code}`)" if code else "")
    return ""
