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

``compile="inductor"`` (``executor.compile``) traces the step with Inductor's decompositions and
compiles the two programs with Inductor's ``compile_fx_inner`` (the compiler ``torch.compile``
hands AOTAutograd's graphs to), the forward first, then the backward at the strides of the
compiled forward's saved tensors. The partition stays the plain one (the same tensors cross from
forward to backward as uncompiled), and Inductor's backward is boxed as the uncompiled one is: it
empties the argument list and deletes each saved tensor after its last use.

Example:
    >>> lin = torch.nn.Linear(3, 2)
    >>> stage = ReplayedStage(lin, input_names=[], received=True)
    >>> x = torch.randn(4, 3, requires_grad=True)
    >>> stage(x).sum().backward()
    >>> stage.mode, tuple(lin.weight.grad.shape), tuple(x.grad.shape)
    ('replay', (2, 3), (4, 3))
"""

from __future__ import annotations

import time

import torch
from torch import fx, nn

from tensoropt.config import COMPILE_BACKENDS


def _call_counts(gm: fx.GraphModule) -> tuple[int, int]:
    """(placeholders, outputs) of a traced program."""
    placeholders = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
    output = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    return placeholders, len(output) if isinstance(output, (tuple, list)) else 1


def _unboxed(compiled):
    """``compiled`` (which takes one list of arguments) called with the arguments themselves."""
    def call(*args):
        return compiled(list(args))
    return call


def _user_visible(gm: fx.GraphModule, first: int | None = None) -> None:
    """Mark ``gm``'s outputs (its ``first`` ones; all by default) as the user sees them, so Inductor
    keeps their eager strides (what ``compile_fx_forward``/``_backward`` mark)."""
    from torch.utils._pytree import arg_tree_leaves

    node = gm.graph.find_nodes(op="output")[0]
    outputs = arg_tree_leaves(*node.args)
    node.meta["user_visible_output_idxs"] = [i for i, n in enumerate(outputs[:first])
                                             if isinstance(n, fx.Node)]


def inductor_programs(forward: fx.GraphModule, backward: fx.GraphModule,
                      inputs: list[torch.Tensor]) -> tuple:
    """``forward`` and ``backward`` (a stage's traced programs) compiled by Inductor: the forward at
    ``inputs`` (the state then the stage's inputs), run once on them (random state untouched) for
    the strides of the tensors it saves, then the backward at those and a contiguous output
    gradient. Returns (forward called with the arguments, backward called boxed: one list it
    empties, the bytes the compiled forward saves for backward: :func:`saved_bytes`).

    Example:
        >>> # not run here: compiles C++ (slow); see tests/pipeline_runtime/test_compiled_stages.py
        >>> fw, bw = inductor_programs(forward, backward, [*state, x])  # doctest: +SKIP
    """
    from torch._inductor.compile_fx import compile_fx_inner

    _user_visible(forward, first=1)  # the stage's output keeps eager strides (its saved tensors need not)
    compiled_fw = compile_fx_inner(forward, list(inputs))
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        outs = compiled_fw(list(inputs))
    _user_visible(backward)  # the gradients keep eager strides, as torch.compile's backward's do
    grad = torch.ones(outs[0].shape, dtype=outs[0].dtype, device=outs[0].device)  # as backward gets it
    compiled_bw = compile_fx_inner(backward, [*outs[1:], grad], is_backward=True)
    return _unboxed(compiled_fw), compiled_bw, saved_bytes(outs, inputs)


def saved_bytes(outs, inputs: list[torch.Tensor]) -> int:
    """Bytes of the tensors a forward program's run hands to backward (``outs[1:]``), each storage
    once, those of its ``inputs`` (parameters, the received activation) left out: what one
    micro-batch in flight holds.

    Example:
        >>> x = torch.ones(4)
        >>> saved_bytes([x * 2, x, x * 3], [x])
        16
    """
    from tensoropt.executor.state.memory import storage_bytes, storage_keys

    return storage_bytes([t for t in outs[1:] if isinstance(t, torch.Tensor)], exclude=storage_keys(inputs))


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
        compile: ``"none"`` (the traced programs replayed as they are) or ``"inductor"`` (compiled
            by Inductor on the first call; see the module docstring).

    Example:
        >>> stage = ReplayedStage(torch.nn.Linear(3, 2), [], received=True)
        >>> stage(torch.randn(4, 3, requires_grad=True)).shape
        torch.Size([4, 2])
    """

    def __init__(self, module: nn.Module, input_names: list[str], received: bool, compile: str = "none"):
        super().__init__()
        if compile not in COMPILE_BACKENDS:
            raise ValueError(f"executor.compile: {compile!r} is not one of {COMPILE_BACKENDS}")
        self.compile = compile
        self.inner = module
        self.input_names = list(input_names)
        self.received = received
        self.param_names = [k for k, _ in module.named_parameters()]
        self.buffer_names = [k for k, _ in module.named_buffers()]
        self.state_count = len(self.param_names) + len(self.buffer_names)
        self.forward_program = None
        """The forward program (an ``fx.GraphModule``, or Inductor's compiled call), called with
        the state then the inputs."""
        self.backward_program = None
        """The backward program, called boxed (one list of the saved tensors and the output's
        gradient, which it empties)."""
        self.mode = "untraced"
        """``"replay"`` once traced, ``"eager: <reason>"`` where the stage could not be traced."""
        self.traces = 0
        self.trace_s = 0.0
        """Seconds the first call spent tracing (and compiling) the programs."""
        self.compile_s = 0.0
        """Of :attr:`trace_s`, the seconds Inductor spent compiling (0 uncompiled)."""
        self.saved_bytes = 0
        """What the forward program saves for backward per micro-batch (:func:`saved_bytes`),
        measured on the first call: compiled, Inductor's decompositions may save other tensors."""
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
        start = time.perf_counter()
        try:
            self._trace(inputs)
        finally:
            self.trace_s += time.perf_counter() - start

    def _trace(self, inputs: list[torch.Tensor]) -> None:
        from functorch.compile import aot_function, make_boxed_func

        caught: list[fx.GraphModule] = []

        def keep(gm, _example):
            caught.append(gm)
            return make_boxed_func(gm)

        state = [t.detach().requires_grad_(t.requires_grad) for t in self.state_values()]
        leaves = [x.detach().requires_grad_(x.requires_grad
                                            or (i == 0 and self.received and x.is_floating_point()))
                  for i, x in enumerate(inputs)]
        decompositions = None
        if self.compile == "inductor":  # what torch.compile traces for Inductor
            from torch._inductor.decomposition import select_decomp_table

            decompositions = select_decomp_table()
        with torch.random.fork_rng(devices=[]):
            out = aot_function(self._functional, fw_compiler=keep, bw_compiler=keep,
                               decompositions=decompositions)(*state, *leaves)
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
        if self.compile == "inductor":
            start = time.perf_counter()
            values = [t.detach() for t in self.state_values()] + [x.detach() for x in inputs]
            try:
                self.forward_program, self.backward_program, self.saved_bytes = inductor_programs(
                    forward, backward, values)
            except Exception as err:  # noqa: BLE001 - any compiler failure: one line naming the way out
                raise RuntimeError(f"executor.compile: inductor could not compile this pipeline stage's "
                                   f"programs ({type(err).__name__}: {err}); train with --compile none "
                                   "(or the job's executor.compile: none)") from err
            self.compile_s += time.perf_counter() - start
        else:
            backward.graph.set_codegen(fx.graph._BoxedCodeGen())
            backward.recompile()
            self.forward_program, self.backward_program = forward, backward
            values = [t.detach() for t in self.state_values()] + [x.detach() for x in inputs]
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                self.saved_bytes = saved_bytes(forward(*values), values)
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
