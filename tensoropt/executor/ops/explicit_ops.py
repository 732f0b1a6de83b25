"""Explicit implementations of the ops DTensor gets wrong (see the guide EXECUTOR.md).

* conv2d split on channels: DTensor labels a local shard Replicate. We run the local conv
  through ``local_map`` with the output and gradient placements worked out per mesh axis.
* scaled_dot_product_attention: DTensor has no CPU strategy with gradients and ``is_causal``
  builds plain tensors. Batch and head splits are local, so ``local_map`` runs the local op.
* batch_norm in training: DTensor silently replicates a batch-sharded input. We run it on local
  shards with the statistics summed across the batch split (:mod:`tensoropt.executor.ops.batch_norm`).

Each function takes DTensor operands already laid out as the plan says and returns the raw
output (with Partial where the configuration's ``partial_axes`` say).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.experimental import local_map

from tensoropt.executor.ops.batch_norm import batch_norm as sync_batch_norm
from tensoropt.executor.ops.vocab_parallel import class_split_cross_entropy


class UnsupportedConfiguration(RuntimeError):
    """A configuration the executor cannot run correctly."""


class _StridedGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        # dense, in x's dim order (x itself may be a strided slice of a larger tensor)
        ctx.size, ctx.stride = x.size(), torch.empty_like(x, device="meta").stride()
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        if grad.stride() == ctx.stride:
            return grad
        return torch.empty_strided(ctx.size, ctx.stride, dtype=grad.dtype, device=grad.device).copy_(grad)


def same_strides_grad(x: torch.Tensor) -> torch.Tensor:
    """Identity (on a local tensor) whose backward lays the gradient out densely in ``x``'s dim order.

    ``local_map`` wraps the local gradient into a DTensor carrying the *forward* DTensor's
    global strides; a local gradient in another dim order (a kernel's choice) then breaks the
    ``view`` in the backward of the view ops before it (torch 2.13).

    Example:
        >>> x = torch.ones(3, 2).t().requires_grad_()
        >>> (same_strides_grad(x) * 2).sum().backward(); x.grad.stride() == x.stride()
        True
    """
    return _StridedGrad.apply(x)


def _dense_strides_in_order(local: torch.Tensor, global_stride: tuple[int, ...]) -> list[int]:
    """Strides of a dense tensor of ``local``'s shape whose dims are ordered as ``global_stride``'s."""
    order = sorted(range(local.dim()), key=lambda d: (-global_stride[d], d))
    want = [0] * local.dim()
    step = 1
    for d in reversed(order):
        want[d] = step
        step *= local.shape[d]
    return want


def _dim_order(shape, stride) -> list[int]:
    """The dims of size > 1, outermost (largest stride) first."""
    return sorted((d for d in range(len(shape)) if shape[d] > 1), key=lambda d: (-stride[d], d))


def _wanted_strides(x: DTensor, dense: bool = False) -> list[int] | None:
    """Dense local strides in ``x``'s global dim order, or None where its local tensor has them
    (``dense=False``: where its local dims are already in that order, a strided slice or not)."""
    local = x._local_tensor
    if local.numel() == 0:
        return None
    want = _dense_strides_in_order(local, x.stride())
    if dense:
        return None if list(local.stride()) == want else want
    same = _dim_order(local.shape, local.stride()) == _dim_order(local.shape, x.stride())
    return None if same else want


def _relaid(x: DTensor, dense: bool) -> DTensor | None:
    """``x`` with its local tensor copied densely into its global dim order, or None if it already is."""
    want = _wanted_strides(x, dense)
    if want is None:
        return None
    local = x._local_tensor
    dense = torch.empty_strided(local.shape, want, dtype=local.dtype, device=local.device).copy_(local)
    return DTensor.from_local(dense, x.device_mesh, x.placements, run_check=False,
                              shape=x.shape, stride=x.stride())


class _ConsistentGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        if not isinstance(grad, DTensor):
            return grad
        relaid = _relaid(grad, dense=True)
        return grad if relaid is None else relaid


class _ConsistentStrides(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _relaid(x, dense=False)

    @staticmethod
    def backward(ctx, grad):
        return grad


def consistent_strides(x: torch.Tensor) -> torch.Tensor:
    """``x`` (a DTensor) with its local tensor laid out in the dim order of its global strides.

    A redistribution (an all-gather) returns a contiguous local tensor while the DTensor keeps
    the global strides of the value before it (torch 2.13). When that value was a transposed
    view (an attention output), DTensor then decides from the global strides that a later
    ``reshape`` is a ``view``, which fails on the local tensor. Applied to every value the
    executor redistributes; a copy only where the two disagree, the identity otherwise.

    Example:
        >>> consistent_strides(torch.ones(2, 3)).shape  # plain tensors pass through
        torch.Size([2, 3])
    """
    if not isinstance(x, DTensor) or _wanted_strides(x) is None:
        return x
    return _ConsistentStrides.apply(x)


def consistent_grad(x: torch.Tensor) -> torch.Tensor:
    """Identity (on a DTensor) whose backward lays the gradient's local tensor out in the dim order
    of the gradient's global strides.

    DTensor's backward of a redistribution (an all-gather) returns a contiguous local tensor
    while the gradient keeps the strides of the forward value (torch 2.13); when the forward
    value was a transposed view, the ``view`` in the backward of the view ops before it then
    fails. Applied to every value the executor redistributes.

    Example:
        >>> x = torch.ones(2, 3, requires_grad=True)
        >>> consistent_grad(x).sum().backward(); x.grad.shape
        torch.Size([2, 3])
    """
    return _ConsistentGrad.apply(x)


class _GradAsForward(torch.autograd.Function):
    """Identity whose backward brings a partial gradient to the forward value's placements."""

    @staticmethod
    def forward(ctx, x):
        ctx.mesh, ctx.placements = x.device_mesh, tuple(x.placements)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        if isinstance(grad, DTensor) and tuple(grad.placements) != ctx.placements \
                and any(p.is_partial() for p in grad.placements):
            grad = grad.redistribute(ctx.mesh, ctx.placements)
        return grad


def _zero_grad_placements(given: DTensor) -> tuple:
    """Placements for a zero gradient beside ``given`` (a sibling's DTensor gradient): its
    shards and plain sums (zeros are zeros in any of them, and the backward op then needs no
    redistribution for the zeros), replicated elsewhere (a masked or max/min partial)."""
    return tuple(p if isinstance(p, (Shard, Replicate)) or (type(p) is Partial and p.reduce_op == "sum")
                 else Replicate() for p in given.placements)


class _EveryOutputGrad(torch.autograd.Function):
    """Identity on a list op's outputs whose backward gives each output a gradient: a zero DTensor
    where autograd has none (an output no consumer read)."""

    @staticmethod
    def forward(ctx, *outputs):
        ctx.set_materialize_grads(False)
        ctx.specs = [(x.shape, x.dtype) if isinstance(x, DTensor) else None for x in outputs]
        return tuple(x.view_as(x) for x in outputs)

    @staticmethod
    def backward(ctx, *grads):
        given = next((g for g in grads if isinstance(g, DTensor)), None)
        if given is None:
            return grads
        placements = _zero_grad_placements(given)
        out = []
        for g, spec in zip(grads, ctx.specs):
            if g is None and spec is not None:
                g = torch.distributed.tensor.zeros(spec[0], dtype=spec[1], device_mesh=given.device_mesh,
                                                   placements=placements)
            out.append(g)
        return tuple(out)


def returns_tensor_list(op) -> bool:
    """Whether aten ``op`` returns one list of tensors (``split``, ``chunk``, ``unbind``, ...).

    Example:
        >>> returns_tensor_list(torch.ops.aten.split.Tensor), returns_tensor_list(torch.ops.aten.topk.default)
        (True, False)
    """
    returns = getattr(getattr(op, "_schema", None), "returns", ())
    return len(returns) == 1 and str(returns[0].type) == "List[Tensor]"


def every_output_grad(outputs):
    """``outputs`` (a list op's DTensor results) such that backward hands every one a gradient.

    Autograd's backward of ``split``/``chunk``/``unbind`` (a ``cat`` or ``stack`` of the outputs'
    gradients) fills the gradient of an output no consumer read with a *plain* zero tensor, which
    DTensor refuses beside the others ("aten.cat.default got mixed torch.Tensor and DTensor"). An
    output goes unread where a model ignores it, and where the interpreter replays a split once
    per layout its consumers need (CodeGen's rotary ``qkv`` split: each replay feeds one of q, k, v).
    Here each missing gradient is a zero DTensor, laid out as a sibling's gradient. Plain tensors
    (and outputs that need no gradient) pass through unchanged.

    Example:
        >>> x = torch.ones(4, requires_grad=True)
        >>> every_output_grad(torch.split(x * 2, 2))[0].shape  # plain tensors: as they are
        torch.Size([2])
    """
    if not isinstance(outputs, (tuple, list)) or not any(
            isinstance(x, DTensor) and x.requires_grad for x in outputs) \
            or not all(isinstance(x, torch.Tensor) for x in outputs) or not torch.is_grad_enabled():
        return outputs
    return type(outputs)(_EveryOutputGrad.apply(*outputs))


def reduce_partial(x: DTensor, mesh, placements) -> DTensor:
    """``x.redistribute(mesh, placements)``, reducing a node's partial output.

    A masked partial (the output of a vocabulary-split embedding) cannot take a ``Partial(sum)``
    gradient in backward (DTensor: "Redistribution from one partial type ... is unsupported"),
    which it gets when the embedding's consumers pass partial gradients on (HF Llama's RMSNorm is
    elementwise ops, and the attention projections' input gradients are partial): that gradient
    is all-reduced to ``placements`` first.

    Example:
        >>> # not run here: needs DTensors on a process group's mesh
        >>> reduce_partial(embedded, mesh, [Replicate()])  # doctest: +SKIP
    """
    out = x.redistribute(mesh, placements)
    if any(type(p).__name__ == "_MaskPartial" for p in x.placements):
        out = _GradAsForward.apply(out)
    return out


def _role(x_p, w_p) -> str:
    if isinstance(x_p, Shard) and x_p.dim == 0 and isinstance(w_p, Replicate):
        return "batch"
    if isinstance(x_p, Replicate) and isinstance(w_p, Shard) and w_p.dim == 0:
        return "out"
    if isinstance(x_p, Shard) and x_p.dim == 1 and isinstance(w_p, Shard) and w_p.dim == 1:
        return "in"
    if isinstance(x_p, Replicate) and isinstance(w_p, Replicate):
        return "none"
    return "?"


_CONV_OUT = {"batch": Shard(0), "out": Shard(1), "in": Partial(), "none": Replicate()}
_CONV_GRAD_X = {"batch": Shard(0), "out": Partial(), "in": Shard(1), "none": Replicate()}
_CONV_GRAD_W = {"batch": Partial(), "out": Shard(0), "in": Shard(1), "none": Replicate()}


def conv2d(node_name: str, x: DTensor, weight: DTensor, stride=1, padding=0, dilation=1, groups=1):
    """conv2d with batch, output-channel or input-channel splits, per mesh axis.

    Output placement per axis: batch -> S(0), out -> S(1), in -> Partial (the raw output);
    the bias is added by the caller after the partial sum is reduced (see :func:`add_bias`).

    Example:
        >>> # not run here: needs DTensors on a process group's mesh
        >>> conv2d("conv2d", x, w, stride=1, padding=1)  # doctest: +SKIP
    """
    roles = [_role(xp, wp) for xp, wp in zip(x.placements, weight.placements)]
    if "?" in roles or (groups != 1 and any(r in ("out", "in") for r in roles)):
        raise UnsupportedConfiguration(
            f"node {node_name!r} (aten.conv2d): input placements {x.placements} with weight "
            f"placements {weight.placements} are not a batch/out-channel/in-channel split "
            "(spatial splits and channel splits of grouped convs are not supported by the executor)"
        )
    fn = local_map(
        lambda xl, wl: F.conv2d(same_strides_grad(xl), same_strides_grad(wl), None, stride, padding, dilation,
                                groups),
        out_placements=[_CONV_OUT[r] for r in roles],
        in_placements=(x.placements, weight.placements),
        in_grad_placements=(tuple(_CONV_GRAD_X[r] for r in roles), tuple(_CONV_GRAD_W[r] for r in roles)),
        device_mesh=x.device_mesh,
    )
    return fn(x, weight)


def pool(node_name: str, op, x: DTensor, *args, **kwargs):
    """A pooling op (max/avg/adaptive) on batch and channel splits, run locally through ``local_map``.

    DTensor has no strategy for ``avg_pool2d_backward`` and fails on adaptive pooling's
    ``as_strided_`` fast path; pooling is independent per sample and channel, so the local op
    is exact.

    Example:
        >>> op = torch.ops.aten.adaptive_avg_pool2d.default
        >>> # not run here: needs DTensors on a process group's mesh
        >>> pool("adaptive_avg_pool2d", op, x, [1, 1])  # doctest: +SKIP
    """
    placements = x.placements
    for p in placements:
        if p.is_partial() or (isinstance(p, Shard) and p.dim not in (0, 1)):
            raise UnsupportedConfiguration(
                f"node {node_name!r} ({op}): placement {p} is not a batch or channel split; "
                "spatial splits of pooling are not supported by the executor"
            )
    fn = local_map(lambda xl: op(same_strides_grad(xl), *args, **kwargs), out_placements=list(placements),
                   in_placements=(placements,), in_grad_placements=(placements,), device_mesh=x.device_mesh)
    return fn(x)


def add_bias(out, bias):
    """Add a per-channel bias (dim 1) to an NCHW (or N C ...) output, DTensor or plain.

    Example:
        >>> add_bias(torch.zeros(1, 2, 1, 1), torch.tensor([1.0, 2.0])).flatten().tolist()
        [1.0, 2.0]
    """
    if bias is None:
        return out
    shape = [1, -1] + [1] * (out.dim() - 2)
    return out + bias.view(shape)


def sdpa(node_name: str, q: DTensor, k: DTensor, v: DTensor, attn_mask=None, dropout_p=0.0,
         is_causal=False, scale=None, enable_gqa=False):
    """Attention split over batch (dim 0) and heads (dim 1), run locally through ``local_map``.

    Example:
        >>> # not run here: needs DTensors on a process group's mesh
        >>> sdpa("scaled_dot_product_attention", q, k, v, is_causal=True)  # doctest: +SKIP
    """
    placements = q.placements
    if k.placements != placements or v.placements != placements:
        raise UnsupportedConfiguration(
            f"node {node_name!r} (aten.scaled_dot_product_attention): q, k, v placements differ "
            f"({q.placements}, {k.placements}, {v.placements}); the executor needs them equal"
        )
    for p in placements:
        if isinstance(p, Shard) and p.dim not in (0, 1) or p.is_partial():
            raise UnsupportedConfiguration(
                f"node {node_name!r} (aten.scaled_dot_product_attention): placement {p} is not a "
                "batch or heads split; sequence splits of attention are not supported"
            )
    masks = ()
    if attn_mask is not None:
        attn_mask = _mask_like(attn_mask, q)
        masks = (attn_mask,)

    def local(ql, kl, vl, *mask):
        ql, kl, vl = (same_strides_grad(t) for t in (ql, kl, vl))
        return F.scaled_dot_product_attention(
            ql, kl, vl, attn_mask=mask[0] if mask else None, dropout_p=dropout_p, is_causal=is_causal,
            scale=scale, enable_gqa=enable_gqa,
        )

    mask_placements = tuple(m.placements for m in masks)
    fn = local_map(
        local,
        out_placements=list(placements),
        in_placements=(placements, placements, placements, *mask_placements),
        in_grad_placements=(placements, placements, placements, *mask_placements),
        device_mesh=q.device_mesh,
    )
    return fn(q, k, v, *masks)


def _mask_like(mask, q: DTensor) -> DTensor:
    """An attention mask laid out to match q's batch/head splits (broadcast dims stay replicated)."""
    if not isinstance(mask, DTensor):
        mask = DTensor.from_local(mask, q.device_mesh, [Replicate()] * q.device_mesh.ndim, run_check=False)
    offset = q.dim() - mask.dim()
    target = []
    for p in q.placements:
        d = p.dim - offset if isinstance(p, Shard) else None
        target.append(Shard(d) if d is not None and d >= 0 and mask.shape[d] > 1 else Replicate())
    if any(p.is_partial() for p in mask.placements) or tuple(mask.placements) != tuple(target):
        mask = mask.redistribute(q.device_mesh, target)
    return mask


def batch_norm(node_name: str, x, weight, bias, running_mean, running_var, training: bool,
               momentum: float, eps: float, *_unused, stats: str = "synchronized"):
    """Training-mode batch norm on a mesh: :func:`tensoropt.executor.ops.batch_norm.batch_norm` (one
    all-reduce of packed per-channel sums in each direction when synchronised, none when ``local``).

    Example:
        >>> out = batch_norm("bn", torch.randn(4, 3), None, None, None, None, True, 0.1, 1e-5)
        >>> tuple(out.shape)
        (4, 3)
    """
    return sync_batch_norm(node_name, x, weight, bias, running_mean, running_var, training, momentum, eps,
                           stats)


def cross_entropy(node_name: str, op, logits, labels, weight=None, reduction: int = 1,
                  ignore_index: int = -100, label_smoothing: float = 0.0):
    """Cross entropy; logits split on the class dim (over any number of mesh axes) computed explicitly.

    With the class dim sharded, :func:`tensoropt.executor.ops.vocab_parallel.class_split_cross_entropy`
    (Megatron's vocabulary-parallel cross entropy: a max and one packed sum all-reduced, a fused
    local pass each way); DTensor's ``loss_parallel`` only handles one mesh axis. Other layouts run
    the op itself.

    Example:
        >>> ce = torch.ops.aten.cross_entropy_loss.default
        >>> # not run here: needs DTensors on a process group's mesh
        >>> cross_entropy("cross_entropy_loss", ce, z, y)  # doctest: +SKIP
    """
    class_sharded = isinstance(logits, DTensor) and any(
        isinstance(p, Shard) and p.dim in (1, logits.dim() - 1) and logits.dim() > 1
        for p in logits.placements)
    if not class_sharded:
        return op(logits, labels, weight, reduction, ignore_index, label_smoothing)
    if logits.dim() != 2 or weight is not None or reduction not in (1, 2) or label_smoothing:
        raise UnsupportedConfiguration(
            f"node {node_name!r} (aten.cross_entropy_loss): a class-split cross entropy needs 2-D logits, "
            "a mean or sum reduction, no class weights and no label smoothing"
        )
    return class_split_cross_entropy(logits, labels, ignore_index, reduction)
