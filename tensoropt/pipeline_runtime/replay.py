"""A stage module whose forward and backward run as traced local programs, driven by torch's schedule.

:class:`ReplayedStage` wraps a stage's ``fx.GraphModule`` (:mod:`tensoropt.pipeline_runtime.
stage_modules`). On its first call it traces the stage's forward and backward once, at the
micro-batch's static shapes, into two ``fx.GraphModule`` programs of aten operators
(``functorch.compile.aot_function``: the joint graph partitioned into a forward that also returns
the tensors backward needs, and a backward from those and the output's gradient). Every call
after runs the forward program with no autograd recording, and the whole stage is one autograd
node (:class:`_StageFunction`) whose backward runs the backward program, adds the parameters'
gradients into ``.grad`` in place and returns the received activation's gradient. So
``torch.distributed.pipelining``'s ``PipelineStage`` drives it unchanged (``forward_one_chunk``
calls the module, ``stage_backward`` calls ``torch.autograd.backward`` on its output), while a
micro-batch costs two program replays instead of one autograd node per operator.

The parameters stay the wrapped module's (``stage.inner``): the optimizer steps them, checkpoints
read them under the model's names. A stage the tracer cannot split (a graph that mutates its
inputs, or whose outputs do not follow the partition's convention) runs eagerly, and
:attr:`ReplayedStage.mode` says so with the reason.

Example:
    >>> lin = torch.nn.Linear(3, 2)
    >>> stage = ReplayedStage(lin, input_names=[], received=True)
    >>> x = torch.randn(4, 3, requires_grad=True)
    >>> stage(x).sum().backward()
    >>> stage.mode, tuple(lin.weight.grad.shape), tuple(x.grad.shape)
    ('replay', (2, 3), (4, 3))
"""

from __future__ import annotations

import torch
from torch import fx, nn


def _call_counts(gm: fx.GraphModule) -> tuple[int, int]:
    """(placeholders, outputs) of a traced program."""
    placeholders = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
    output = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    return placeholders, len(output) if isinstance(output, (tuple, list)) else 1


class _StageFunction(torch.autograd.Function):
    """The whole stage as one autograd node: forward program, then backward program on demand."""

    @staticmethod
    def forward(ctx, stage: ReplayedStage, anchor: torch.Tensor, *inputs: torch.Tensor):
        outs = stage.forward_program(*stage.state_values(), *inputs)
        ctx.stage, ctx.saved = stage, list(outs[1:])
        ctx.grad_inputs = [i.requires_grad for i in inputs]
        return outs[0]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        stage, args = ctx.stage, ctx.saved
        ctx.saved = None
        args.append(grad.contiguous())
        del grad
        grads = stage.backward_program(args)  # boxed: it empties ``args`` and frees each saved
        # tensor after its last use, as a joint program would
        n = stage.state_count
        for p, g in zip(stage.trained, grads[:n]):
            if p is None or g is None:
                continue
            if p.grad is None:
                p.grad = g.detach().clone()
            else:
                p.grad.add_(g)
        inputs = [g if want else None for g, want in zip(grads[n:], ctx.grad_inputs)]
        return (None, None, *inputs)


class ReplayedStage(nn.Module):
    """``module`` as a pipeline stage whose forward and backward replay traced programs.

    Args:
        module: the stage (its first positional argument the received activation when
            ``received``, then the graph inputs named ``input_names`` as keyword arguments).
        input_names: the keyword arguments ``module`` takes, in the order they are passed on.
        received: whether the stage takes a received activation as its first argument.

    Example:
        >>> stage = ReplayedStage(torch.nn.Linear(3, 2), [], received=True)
        >>> stage(torch.randn(4, 3, requires_grad=True)).shape
        torch.Size([4, 2])
    """

    def __init__(self, module: nn.Module, input_names: list[str], received: bool):
        super().__init__()
        self.inner = module
        self.input_names = list(input_names)
        self.received = received
        self.param_names = [k for k, _ in module.named_parameters()]
        self.buffer_names = [k for k, _ in module.named_buffers()]
        self.state_count = len(self.param_names) + len(self.buffer_names)
        self.forward_program: fx.GraphModule | None = None
        self.backward_program: fx.GraphModule | None = None
        self.mode = "untraced"
        """``"replay"`` once traced, ``"eager: <reason>"`` where the stage could not be traced."""
        self.traces = 0
        self.anchor = torch.zeros((), requires_grad=True)
        """A leaf the stage's output depends on, so the first stage's output (which depends on no
        received tensor) still has a backward for the schedule to run."""
        self.trained: list[torch.Tensor | None] = []

    def state_values(self) -> list[torch.Tensor]:
        """The wrapped module's parameters then buffers, as the programs take them (live tensors)."""
        params = dict(self.inner.named_parameters())
        buffers = dict(self.inner.named_buffers())
        return [params[k] for k in self.param_names] + [buffers[k] for k in self.buffer_names]

    def _functional(self, *flat):
        state = dict(zip(self.param_names + self.buffer_names, flat[: self.state_count]))
        rest = flat[self.state_count :]
        args = rest[:1] if self.received else ()
        kwargs = dict(zip(self.input_names, rest[len(args) :]))
        return torch.func.functional_call(self.inner, state, args, kwargs)

    def trace(self, inputs: list[torch.Tensor]) -> None:
        """Trace the forward and backward programs at ``inputs``' shapes (parameters' gradients and
        the random state untouched). Falls back to eager (:attr:`mode`) where the partition is not
        the plain one this wrapper replays.

        Example:
            >>> stage = ReplayedStage(torch.nn.Linear(3, 2), [], received=True)
            >>> stage.trace([torch.randn(4, 3)])
            >>> stage.mode
            'replay'
        """
        from functorch.compile import aot_function, make_boxed_func

        caught: list[fx.GraphModule] = []

        def keep(gm, _example):
            caught.append(gm)
            return make_boxed_func(gm)

        state = [t.detach().requires_grad_(t.requires_grad) for t in self.state_values()]
        leaves = [x.detach().requires_grad_(x.requires_grad
                                            or (i == 0 and self.received and x.is_floating_point()))
                  for i, x in enumerate(inputs)]
        with torch.random.fork_rng(devices=[]):
            out = aot_function(self._functional, fw_compiler=keep, bw_compiler=keep)(*state, *leaves)
            if not isinstance(out, torch.Tensor) or not out.requires_grad:
                self.mode = "eager: the stage's output is not one tensor with a gradient"
                return
            out.backward(torch.ones_like(out))
        self.traces += 1
        if len(caught) != 2:
            self.mode = f"eager: the tracer gave {len(caught)} programs, not a forward and a backward"
            return
        forward, backward = caught
        fw_in, fw_out = _call_counts(forward)
        bw_in, bw_out = _call_counts(backward)
        if fw_in != self.state_count + len(inputs) or bw_out != fw_in or bw_in != fw_out:
            self.mode = ("eager: the traced programs do not follow the plain forward/backward split "
                         f"(forward {fw_in} -> {fw_out}, backward {bw_in} -> {bw_out})")
            return
        backward.graph.set_codegen(fx.graph._BoxedCodeGen())
        backward.recompile()
        self.forward_program, self.backward_program = forward, backward
        params = dict(self.inner.named_parameters())
        self.trained = [params[k] if params[k].requires_grad else None for k in self.param_names]
        self.trained += [None] * len(self.buffer_names)
        self.mode = "replay"

    def forward(self, *args, **kwargs):
        inputs = [*args[:1]] if self.received else []
        inputs += [kwargs[n] for n in self.input_names]
        if self.mode == "untraced":
            self.trace(inputs)
        if self.mode != "replay":
            return self.inner(*args, **kwargs)
        return _StageFunction.apply(self, self.anchor, *inputs)
