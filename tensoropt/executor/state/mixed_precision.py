"""Mixed precision in the executor: float32 master parameters cast where used, dynamic loss scaling.

``training.precision: bf16-mixed | fp16-mixed`` (:mod:`tensoropt.precision`): the graph is exported
in the compute dtype (bfloat16 / float16) and the trainer keeps every parameter in float32. The
:class:`~tensoropt.executor.program.interpreter.PlanInterpreter` casts each parameter to the compute dtype
where the graph reads it (:func:`cast_param`: an explicit ``.to(dtype)``, part of the autograd graph
and of the traced replay program, never a global autocast), so backward brings the gradient back
through the cast to the float32 master in float32, where it is all-reduced and stepped.

fp16's range is narrow: ``fp16-mixed`` scales the loss's gradient by :class:`LossScaler`'s scale
(:func:`scale_grad`: identity forward, the gradient times the scale in backward, so the loss read
stays unscaled), unscales the float32 gradients before the optimizer step, skips the step when
any of them is not finite on any rank and then halves the scale, and doubles it after
``growth_interval`` finite steps in a row (``torch.amp.GradScaler``'s rule).

Example:
    >>> w = torch.ones(2, requires_grad=True)
    >>> (cast_param(w, torch.bfloat16) * 3).sum().backward()
    >>> w.grad.dtype, w.grad.tolist()
    (torch.float32, [3.0, 3.0])
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

__all__ = ["LossScaler", "cast_param", "compute_module", "master_of", "scale_grad", "to_compute"]


def cast_param(value, dtype: torch.dtype | None):
    """``value`` cast to ``dtype`` when it is a floating parameter (a leaf needing a gradient) of another one.

    Anything else (inputs, buffers, integer tensors, ``dtype`` None) is returned as it is.

    Example:
        >>> cast_param(torch.ones(1, requires_grad=True), torch.float16).dtype
        torch.float16
        >>> cast_param(torch.ones(1), torch.float16).dtype  # not a parameter
        torch.float32
    """
    if (dtype is None or not isinstance(value, torch.Tensor) or not value.requires_grad
            or not value.is_leaf or not value.is_floating_point() or value.dtype == dtype):
        return value
    cast = value.to(dtype)
    cast._tensoropt_master = value  # see master_of
    return cast


def master_of(value: torch.Tensor) -> torch.Tensor | None:
    """The float32 parameter a :func:`cast_param` copy was made from (None for anything else).

    ZeRO-3 gathers the cast shard; its recipe for backward casts the master again instead of
    keeping the cast shard alive (:mod:`tensoropt.executor.state.options`).

    Example:
        >>> w = torch.ones(1, requires_grad=True)
        >>> master_of(cast_param(w, torch.bfloat16)) is w, master_of(w)
        (True, None)
    """
    return getattr(value, "_tensoropt_master", None)


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale: float):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None


def scale_grad(loss: torch.Tensor, scale: float) -> torch.Tensor:
    """``loss`` unchanged, whose gradient in backward is multiplied by ``scale``.

    Example:
        >>> x = torch.ones(1, requires_grad=True)
        >>> scale_grad(x * 2, 8.0).sum().backward(); x.grad
        tensor([16.])
    """
    return _ScaleGrad.apply(loss, scale)


def compute_module(module: torch.nn.Module, dtype: torch.dtype | None) -> torch.nn.Module:
    """The module to export: ``module`` itself, or in a mixed precision a copy cast to ``dtype``.

    The float32 module (parameters on meta) is what the weights are initialised from; the exported
    graph computes in ``dtype`` (its placeholders, the tensors it creates, its buffers).

    Example:
        >>> compute_module(torch.nn.Linear(2, 2), torch.bfloat16).weight.dtype
        torch.bfloat16
        >>> lin = torch.nn.Linear(2, 2); compute_module(lin, None) is lin
        True
    """
    if dtype is None:
        return module
    return copy.deepcopy(module).to(dtype)


def to_compute(value, dtype: torch.dtype | None):
    """A floating buffer or constant in the compute ``dtype`` (anything else unchanged).

    Example:
        >>> to_compute(torch.ones(1), torch.float16).dtype
        torch.float16
        >>> to_compute(torch.ones(1, dtype=torch.long), torch.float16).dtype
        torch.int64
    """
    if (dtype is None or not isinstance(value, torch.Tensor) or not value.is_floating_point()
            or value.dtype == dtype):
        return value
    return value.to(dtype)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t


class LossScaler:
    """Dynamic loss scale of ``fp16-mixed`` (the rule of ``torch.amp.GradScaler``).

    Args:
        scale: the initial scale.
        growth_interval: finite steps in a row after which the scale doubles.

    Example:
        >>> s = LossScaler(scale=8.0, growth_interval=2)
        >>> g = torch.full((2,), 16.0)
        >>> s.unscale([g]), g.tolist()
        (True, [2.0, 2.0])
        >>> s.update(True), s.update(True), s.scale
        (False, True, 16.0)
        >>> s.unscale([torch.tensor([float("inf")])]), s.update(False), s.scale
        (False, True, 8.0)
    """

    def __init__(self, scale: float = 2.0**16, growth_interval: int = 2000):
        if scale <= 0 or growth_interval < 1:
            raise ValueError(f"LossScaler: scale must be > 0 and growth_interval >= 1, got {scale}, "
                             f"{growth_interval}")
        self.scale = float(scale)
        self.growth_interval = growth_interval
        self.good_steps = 0
        self.skipped = 0

    @torch.no_grad()
    def unscale(self, grads: list[torch.Tensor]) -> bool:
        """Divide ``grads`` (in place) by the scale; whether all are finite on every rank.

        A collective when a process group is initialised (one int all-reduce): call on all ranks.
        """
        inv = 1.0 / self.scale
        bad = torch.zeros((), dtype=torch.float32)
        for g in grads:
            local = _local(g)
            local.mul_(inv)
            bad = bad + (~torch.isfinite(local)).any().to(torch.float32).cpu()
        if dist.is_initialized() and dist.get_world_size() > 1:
            device = _local(grads[0]).device if grads else torch.device("cpu")
            flag = bad.to(device).reshape(1)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            bad = flag.cpu()
        return not bool(bad.item() > 0)

    def state_dict(self) -> dict:
        """The scaler's state, for a checkpoint: the scale, the finite steps since it last moved, the
        steps skipped.

        Example:
            >>> s = LossScaler(scale=8.0); _ = s.update(True); s.state_dict()
            {'scale': 8.0, 'growth_interval': 2000, 'good_steps': 1, 'skipped': 0}
            >>> t = LossScaler(); t.load_state_dict(s.state_dict()); (t.scale, t.good_steps)
            (8.0, 1)
        """
        return {"scale": self.scale, "growth_interval": self.growth_interval, "good_steps": self.good_steps,
                "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict`'s ``state`` (a resumed run's loss scale)."""
        self.scale = float(state["scale"])
        self.growth_interval = int(state.get("growth_interval", self.growth_interval))
        self.good_steps, self.skipped = int(state["good_steps"]), int(state["skipped"])

    def update(self, finite: bool) -> bool:
        """Next scale after a step whose gradients were ``finite``; whether the scale changed."""
        if not finite:
            self.scale *= 0.5
            self.good_steps = 0
            self.skipped += 1
            return True
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.scale *= 2.0
            self.good_steps = 0
            return True
        return False
