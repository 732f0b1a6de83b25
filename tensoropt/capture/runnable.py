"""Whether every op of a captured step can run where the plan sends it: checked at planning time.

An op with no parallel rule still runs (the executor's replicated fallback,
``tensoropt.executor.ops.fallback``), but an op with no kernel for the run's devices (a custom op
registered with a fake/meta kernel only, a CUDA-only kernel planned for CPU processes), or with no
backward where the step needs its gradient, cannot run at all. :func:`check_runnable` finds them
before anything is launched and raises :class:`UnrunnableOpError` naming the op, its module and
the way out, instead of a crash inside every worker.
"""

from __future__ import annotations

import torch

from tensoropt.capture.fxroles import module_of, op_name, tensor_args

_ANY_DEVICE_KEYS = ("CompositeImplicitAutograd", "CompositeExplicitAutograd",
                    "CompositeExplicitAutogradNonFunctional")
"""Dispatch keys whose kernel serves every device."""


class UnrunnableOpError(ValueError):
    """An op of the captured step cannot run on the plan's devices; the message says what to do."""


def _has_kernel(op: torch._ops.OpOverload, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key)


def runs_on(op: torch._ops.OpOverload, device_kind: str) -> bool | None:
    """Whether ``op`` has a kernel for ``device_kind`` (``"cpu"`` or ``"gpu"``).

    None when this torch cannot tell (a GPU cluster planned with a CPU-only torch: its CUDA
    kernels are not built in).

    Example:
        >>> runs_on(torch.ops.aten.relu.default, "cpu"), runs_on(torch.ops.aten.pad.default, "cpu")
        (True, True)
        >>> runs_on(torch.ops.aten._flash_attention_forward.default, "cpu")
        False
    """
    if any(_has_kernel(op, k) for k in _ANY_DEVICE_KEYS):
        return True
    if device_kind == "cpu":
        return _has_kernel(op, "CPU")
    if not torch.backends.cuda.is_built():
        return None
    return _has_kernel(op, "CUDA")


def has_backward(op: torch._ops.OpOverload) -> bool:
    """Whether autograd can differentiate ``op`` (an autograd kernel, or it decomposes into ops).

    Example:
        >>> has_backward(torch.ops.aten.linear.default), has_backward(torch.ops.aten.relu.default)
        (True, True)
    """
    return _has_kernel(op, "Autograd") or _has_kernel(op, "CompositeImplicitAutograd")


def _float(node) -> bool:
    v = node.meta.get("val")
    if isinstance(v, (tuple, list)):
        return any(isinstance(t, torch.Tensor) and t.is_floating_point() for t in v)
    return isinstance(v, torch.Tensor) and v.is_floating_point()


def unrunnable_ops(ep: torch.export.ExportedProgram, device_kind: str) -> list[str]:
    """One message per op of ``ep`` that cannot run on ``device_kind`` devices (empty: all can).

    Example:
        >>> from tensoropt.capture.export import export_program
        >>> unrunnable_ops(export_program(torch.nn.Linear(4, 2), (torch.randn(3, 4),)), "cpu")
        []
    """
    params = set(ep.graph_signature.inputs_to_parameters)
    needs_grad: set = set()
    problems: dict[str, list[str]] = {}
    for n in ep.graph.nodes:
        if n.op == "placeholder" and n.name in params:
            needs_grad.add(n)
        if n.op != "call_function":
            continue
        grad = _float(n) and any(a in needs_grad for a in tensor_args(n))
        if grad:
            needs_grad.add(n)
        if not isinstance(n.target, torch._ops.OpOverload):
            continue
        name = op_name(n.target)
        module = module_of(n) or "<root>"
        if runs_on(n.target, device_kind) is False:
            where = "CPU processes" if device_kind == "cpu" else "GPUs"
            problems.setdefault(name, []).append(
                f"operator {name} (in module {module}) has no kernel for {where}: give it one "
                f"(torch.library: register a {'CPU' if device_kind == 'cpu' else 'CUDA'} kernel), "
                "replace it with standard torch ops in that module"
                + (", or plan for a GPU cluster" if device_kind == "cpu" else ""))
        elif grad and not has_backward(n.target):
            problems.setdefault(name, []).append(
                f"operator {name} (in module {module}) needs a gradient in this training step but has "
                "no backward: register one (torch.library.register_autograd), or compute it on detached "
                "inputs / under torch.no_grad() if it needs none")
    return [msgs[0] + (f" (and {len(msgs) - 1} more uses)" if len(msgs) > 1 else "")
            for msgs in problems.values()]


def check_runnable(ep: torch.export.ExportedProgram, device_kind: str) -> None:
    """Raise :class:`UnrunnableOpError` if an op of ``ep`` cannot run on ``device_kind`` devices.

    Example:
        >>> from tensoropt.capture.export import export_program
        >>> check_runnable(export_program(torch.nn.Linear(4, 2), (torch.randn(3, 4),)), "cpu")
    """
    problems = unrunnable_ops(ep, device_kind)
    if problems:
        raise UnrunnableOpError("the training step cannot run:\n  " + "\n  ".join(problems))
