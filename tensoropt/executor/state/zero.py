"""Sharded optimizer state (ZeRO-1) and sharded gradients (ZeRO-2) of a plan's parameters.

A parameter of a node whose configuration carries ``zero1`` or ``zero2`` keeps its full local
tensor (the layout the operator computes with), but the optimizer holds a *shard parameter*
instead: a DTensor whose placements are the parameter's, sharded further over its gradient-sync
axes (:func:`tensoropt.configspace.options.state_layouts`), and whose local tensor is a view of the
parameter's local tensor (no copy: the shard is a slice along a dim no other mesh axis splits).
The optimizer's state (momentum, Adam moments) is created for that shard only.

* ``zero1``: the gradient is all-reduced as for any data-parallel parameter; the shard's gradient
  is the matching slice of it (a view).
* ``zero2``: as soon as backward has accumulated the gradient (a post-accumulate-grad hook), it
  is reduce-scattered to the shard and the full gradient is dropped: from then on the rank holds
  only its gradient shard (the full gradients of the zero2 parameters never coexist).

After the optimizer step the updated shards are all-gathered into the parameters
(:meth:`ShardedState.gather`). Checkpoints save the shard parameters in place of the parameters
(:meth:`ShardedState.checkpoint_params`: DCP reshards them like any DTensor) and gather after
loading.

Example:
    >>> # not run here: needs a plan's parameters on a process group's mesh
    >>> zero = ShardedState.for_plan(plan, params, mesh)  # doctest: +SKIP
    >>> optimizer = spec.make_optimizer(zero.optimizer_params(params))  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.tensor import DeviceMesh, DTensor

from tensoropt.configspace.configuration import Layout, shard_dim
from tensoropt.configspace.options import state_layouts
from tensoropt.executor.ops.placements import normalise, to_placements


@dataclass
class _Sharded:
    """One zero1/zero2 parameter: the parameter, its shard parameter and how the shard was cut."""

    param: torch.nn.Parameter
    shard: torch.nn.Parameter
    grads_too: bool  # zero2
    dim: int
    start: int
    length: int


def _slice_of(layout: Layout, param: DTensor, mesh: DeviceMesh, axes: tuple[int, ...]) -> tuple[int, ...]:
    """(dim, start, length) of this rank's shard inside ``param``'s local tensor."""
    dim = next(shard_dim(p) for a, p in enumerate(layout) if a in axes)
    coord = mesh.get_coordinate()
    index, degree = 0, 1
    for a in sorted(axes):  # DTensor nests shards of one dim in mesh-axis order
        index = index * mesh.size(a) + coord[a]
        degree *= mesh.size(a)
    length = param._local_tensor.shape[dim] // degree
    return dim, index * length, length


class ShardedState:
    """The zero1/zero2 parameters of one trainer (empty when the plan has none).

    Example:
        >>> ShardedState({}).optimizer_params({"w": torch.zeros(2)})  # no zero parameter: unchanged
        [tensor([0., 0.])]
    """

    def __init__(self, sharded: dict[str, _Sharded]):
        self.sharded = sharded
        for s in sharded.values():
            if s.grads_too:
                s.param.register_post_accumulate_grad_hook(self._reduce_scatter_hook(s))

    @classmethod
    def for_plan(cls, plan, params: dict[str, torch.nn.Parameter], mesh: DeviceMesh | None) -> ShardedState:
        """The shard parameters of ``plan``'s zero1/zero2 nodes (``params``: state-dict key -> parameter).

        Example:
            >>> # not run here: needs a plan's parameters on a process group's mesh
            >>> ShardedState.for_plan(plan, trainer.params, trainer.mesh)  # doctest: +SKIP
        """
        if mesh is None:
            return cls({})
        shapes = {k: tuple(p.shape) for k, p in params.items()}
        sharded = {}
        for config in plan.placements.values():
            sync = dict(config.grad_sync_axes)
            for key, layout in state_layouts(config, shapes, plan.mesh).items():
                if key not in params:
                    raise ValueError(
                        f"plan {plan.plan_id}: {','.join(config.options)} shards parameter {key!r}, which is "
                        "tied to another (shares its storage): re-plan (the planner never offers it)"
                    )
                p = params[key]
                dim, start, length = _slice_of(layout, p, mesh, tuple(sync[key]))
                view = p._local_tensor.detach().narrow(dim, start, length)
                placements = to_placements(normalise(layout, p.dim()))
                shard = torch.nn.Parameter(DTensor.from_local(view, mesh, placements, run_check=False,
                                                              shape=p.shape, stride=p.stride()))
                sharded[key] = _Sharded(p, shard, "zero2" in config.options, dim, start, length)
        return cls(sharded)

    def _reduce_scatter_hook(self, s: _Sharded):
        def hook(param: torch.Tensor) -> None:
            grad, param.grad = param.grad, None
            if grad is None:
                return
            shard = grad.redistribute(s.shard.device_mesh, s.shard.placements)  # reduce-scatter
            local = shard._local_tensor
            if local.untyped_storage().nbytes() > local.numel() * local.element_size():
                shard = shard.clone()  # a slice of a full buffer: keep the shard alone
            s.shard.grad = shard if s.shard.grad is None else s.shard.grad + shard

        return hook

    def optimizer_params(self, params: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """What the optimizer steps: each parameter, or its shard parameter where it has one."""
        return [self.sharded[k].shard if k in self.sharded else p for k, p in params.items()]

    def checkpoint_params(self, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """State-dict key -> the tensor a checkpoint saves and loads (the shard parameter if any)."""
        return {k: self.sharded[k].shard if k in self.sharded else p for k, p in params.items()}

    def shard_gradients(self) -> None:
        """Give zero1 shards their gradient: the slice of the (all-reduced) parameter gradient."""
        for s in self.sharded.values():
            grad = s.param.grad
            if s.grads_too or grad is None:
                continue
            if tuple(grad.placements) != tuple(s.param.placements):
                raise RuntimeError("zero1: the gradient must be synchronised before the optimizer step "
                                   f"(it is {grad.placements}, the parameter {s.param.placements})")
            view = grad._local_tensor.narrow(s.dim, s.start, s.length)
            s.shard.grad = DTensor.from_local(view, s.shard.device_mesh, s.shard.placements, run_check=False,
                                              shape=s.shard.shape, stride=s.shard.stride())

    def gradients(self) -> list[torch.Tensor]:
        """The shard gradients held (zero2's are the only copy; zero1's are views of the full one)."""
        return [s.shard.grad for s in self.sharded.values() if s.shard.grad is not None]

    @torch.no_grad()
    def gather(self) -> None:
        """All-gather the (updated) shards into the parameters' local tensors."""
        for s in self.sharded.values():
            full = s.shard.detach().redistribute(s.param.device_mesh, s.param.placements)
            s.param._local_tensor.copy_(full._local_tensor)

    def zero_grad(self) -> None:
        """Drop the gradients of the sharded parameters and of their shards."""
        for s in self.sharded.values():
            s.param.grad = None
            s.shard.grad = None
