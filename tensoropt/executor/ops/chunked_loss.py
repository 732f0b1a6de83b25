"""The chunked head + loss in the executor: ``chunked_loss`` (what it means and costs:
:mod:`estimators.chunked_loss`).

A plan gives ``chunked_loss`` to a head (a linear) and the cross entropy that reads its logits.
The interpreter (:class:`tensoropt.executor.program.interpreter.PlanInterpreter`) leaves the head's node
unevaluated (a marker: nothing reads it but the loss, through views) and, at the loss's node,
lays out the head's operands as the head's configuration says (its input rows, the whole weight:
all-gathered under zero3, registered to be gathered again in backward) and the labels as the
loss's, then runs :func:`chunked_linear_cross_entropy` on the local tensors: one autograd
function that, per chunk of ``training.loss_chunk_tokens`` rows, computes the logits in the
head's dtype, casts them to the loss's (HuggingFace upcasts to float32), takes the rows' loss
sum and frees them; its backward computes each chunk's logits again, the softmax's gradient, the
chunk's input gradient and adds its weight gradient. Only the head's input, the weight and the
labels are saved. The rank's rows' sum over the count of valid labels on all ranks (one
all-reduce of a number over the axes that split the rows; a sum reduction needs none) is its
share of the loss: a Partial(sum) DTensor over those axes, reduced as the loss's configuration
says. The loop runs the same ops in the same order in forward and backward, so it replays under
``make_fx`` (the replay mode's trace) as in eager mode.

Example:
    >>> h, w, y = torch.randn(5, 3), torch.randn(7, 3), torch.tensor([0, 6, -100, 2, 3])
    >>> fused = chunked_linear_cross_entropy(h, w, None, y, chunk_tokens=2)
    >>> plain = torch.nn.functional.cross_entropy(h @ w.T, y, reduction="sum")
    >>> bool(torch.allclose(fused, plain, atol=1e-5))
    True
"""

from __future__ import annotations

import torch
import torch.distributed._functional_collectives as funcol
import torch.fx as fx
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from estimators.chunked_loss import CHUNKED_LOSS, DEFAULT_CHUNK_TOKENS
from tensoropt.configspace.configuration import Configuration
from tensoropt.configspace.options import base_configuration
from tensoropt.executor.job.program import op_name, packet_name

__all__ = ["chunked_linear_cross_entropy", "head_of", "is_chunked", "run_loss"]

_CE_ARGS = ("input", "target", "weight", "reduction", "ignore_index", "label_smoothing")
_SUM = 2


def is_chunked(config: Configuration | None) -> bool:
    """Whether a node's configuration carries ``chunked_loss``.

    Example:
        >>> is_chunked(None)
        False
    """
    return config is not None and CHUNKED_LOSS in config.options


def _logits(hidden: torch.Tensor, weight: torch.Tensor, bias, dtype: torch.dtype) -> torch.Tensor:
    """float32 logits of some rows: the matmul in the head's dtype, cast as the loss reads them."""
    z = torch.nn.functional.linear(hidden, weight, bias)
    return z.to(dtype).float()


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, ignore_index: int, chunk_tokens: int, dtype):
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk_tokens):
            z = _logits(hidden[start:start + chunk_tokens], weight, bias, dtype)
            y = labels[start:start + chunk_tokens]
            valid = y != ignore_index
            index = torch.where(valid, y, torch.zeros_like(y)).unsqueeze(1)
            rows = torch.logsumexp(z, dim=1) - z.gather(1, index).squeeze(1)
            total = total + (rows * valid).sum()
            del z
        ctx.save_for_backward(hidden, weight, labels, *(() if bias is None else (bias,)))
        ctx.ignore_index, ctx.chunk_tokens, ctx.dtype = ignore_index, chunk_tokens, dtype
        return total.to(dtype)

    @staticmethod
    def backward(ctx, grad):
        hidden, weight, labels, *rest = ctx.saved_tensors
        bias = rest[0] if rest else None
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros_like(weight)
        grad_bias = None if bias is None else torch.zeros_like(bias)
        g = grad.float()
        for start in range(0, hidden.shape[0], ctx.chunk_tokens):
            stop = start + ctx.chunk_tokens
            h = hidden[start:stop]
            z = _logits(h, weight, bias, ctx.dtype)
            y = labels[start:stop]
            valid = y != ctx.ignore_index
            index = torch.where(valid, y, torch.zeros_like(y)).unsqueeze(1)
            z.sub_(torch.logsumexp(z, dim=1, keepdim=True)).exp_()  # the softmax, in place
            z.scatter_add_(1, index, -valid.to(z.dtype).unsqueeze(1))
            z.mul_((valid.to(z.dtype) * g).unsqueeze(1))
            dz = z.to(ctx.dtype).to(hidden.dtype)
            del z
            grad_hidden[start:stop] = dz @ weight
            grad_weight.addmm_(dz.t(), h)
            if grad_bias is not None:
                grad_bias += dz.sum(0)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None


def chunked_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                                 labels: torch.Tensor, ignore_index: int = -100,
                                 chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
                                 logits_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Sum over rows of ``cross_entropy(linear(hidden, weight, bias), labels)``, one chunk of rows at a time.

    Args:
        hidden: the head's input rows ``N x D`` (local tensors).
        weight, bias: the head's ``V x D`` weight and optional bias.
        labels: ``N`` class indices; ``ignore_index`` rows count nothing.
        chunk_tokens: rows per chunk (the logits of one chunk are alive at a time, forward and backward).
        logits_dtype: the dtype the loss reads the logits in (the matmul's output is cast to it;
            the arithmetic is float32); None: the matmul's dtype.

    Returns:
        The loss sum, a 0-d tensor of ``logits_dtype``.

    Example:
        >>> h = torch.randn(6, 4, requires_grad=True); w = torch.randn(5, 4, requires_grad=True)
        >>> y = torch.tensor([1, 2, 3, 4, 0, -100])
        >>> chunked_linear_cross_entropy(h, w, None, y, chunk_tokens=4).backward()
        >>> h2, w2 = h.detach().requires_grad_(), w.detach().requires_grad_()
        >>> torch.nn.functional.cross_entropy(h2 @ w2.T, y, reduction="sum").backward()
        >>> bool(torch.allclose(h.grad, h2.grad, atol=1e-5) and torch.allclose(w.grad, w2.grad, atol=1e-5))
        True
    """
    dtype = logits_dtype or torch.promote_types(hidden.dtype, weight.dtype)
    return _ChunkedLinearCrossEntropy.apply(hidden, weight, bias, labels, int(ignore_index),
                                            max(1, int(chunk_tokens)), dtype)


def head_of(loss: fx.Node, lazy: set[str]) -> fx.Node:
    """The node whose value a loss node's logits are views of (its head).

    Example:
        >>> g = fx.Graph(); x = g.placeholder("x")
        >>> v = g.call_function(torch.ops.aten.view.default, (x, [-1]))
        >>> head_of(g.call_function(torch.ops.aten.cross_entropy_loss.default, (v, x)), {v.name}).name
        'x'
    """
    a = loss.args[0]
    while a.name in lazy:
        a = a.args[0]
    return a


def _logits_dtype(loss: fx.Node) -> torch.dtype | None:
    val = loss.args[0].meta.get("val") if isinstance(loss.args[0], fx.Node) else None
    return getattr(val, "dtype", None)


def _rows(value: DTensor, what: str, node: fx.Node) -> list[int]:
    """Mesh axes ``value`` is split on (dim 0 only; refused otherwise)."""
    axes = []
    for axis, p in enumerate(value.placements):
        if isinstance(p, Shard) and p.dim == 0:
            axes.append(axis)
        elif not isinstance(p, Replicate):
            raise RuntimeError(f"node {node.name!r} ({op_name(node)}, chunked_loss): {what} is laid out "
                               f"{value.placements}; the fused loss needs rows split on dim 0 or replicated "
                               "(re-plan: the planner offers chunked_loss only there)")
    return axes


def run_loss(interp, loss: fx.Node, config: Configuration, lay_out) -> DTensor:
    """The loss node's value under ``chunked_loss``: the fused head + loss on this rank's rows.

    Args:
        interp: the PlanInterpreter (its env holds the head's marker and the loss's operands).
        loss: the cross entropy node.
        config: its configuration.
        lay_out: ``(interp, node, configuration) -> (args, kwargs)`` laying out the head's operands with
            its memory options (:func:`tensoropt.executor.state.options.lay_out`).

    Example:
        >>> value = run_loss(interpreter, node, config, lay_out)  # needs a PlanInterpreter  # doctest: +SKIP
    """
    head = head_of(loss, interp.lazy)
    head_config = interp.placements.get(head.name)
    if not is_chunked(head_config) or packet_name(head) != "linear":
        raise RuntimeError(f"node {loss.name!r} (chunked_loss): its logits come from {head.name!r} "
                           f"({op_name(head)}), which the plan does not give chunked_loss; re-plan")
    head_args, head_kwargs = lay_out(interp, head, head_config)
    bound = dict(zip(("input", "weight", "bias"), head_args), **head_kwargs)
    hidden, weight, bias = bound["input"], bound["weight"], bound.get("bias")
    if any(p != Replicate() for p in weight.placements):
        raise RuntimeError(f"node {head.name!r} (chunked_loss): its weight is laid out {weight.placements}; "
                           "the fused loss needs the whole weight on each rank (re-plan)")
    ce = dict(zip(_CE_ARGS, loss.args), **loss.kwargs)
    base = base_configuration(config)
    operands = interp.operands.get(loss.name) or []
    if len(operands) < 2 or operands[1]["role"] != "input" or not isinstance(ce.get("target"), fx.Node):
        raise RuntimeError(f"node {loss.name!r} (chunked_loss): its labels are not an activation the "
                           "OpGraph lists; re-plan this model")
    labels = interp._operand(loss, ce["target"], operands[1], base, {})
    axes = _rows(hidden, "the head's input", head)
    if _rows(labels, "the labels", loss) != axes:
        raise RuntimeError(f"node {loss.name!r} (chunked_loss): the labels are laid out {labels.placements} "
                           f"but the head's input {hidden.placements}; re-plan this model")
    mesh = hidden.device_mesh
    grads = [Partial() if a in axes else Replicate() for a in range(mesh.ndim)]
    h = hidden.to_local(grad_placements=hidden.placements)
    rows = h.reshape(-1, h.shape[-1])
    y = labels.to_local().reshape(-1)
    if rows.shape[0] != y.shape[0]:
        raise RuntimeError(f"node {loss.name!r} (chunked_loss): this rank holds {rows.shape[0]} rows of the "
                           f"head's input but {y.shape[0]} labels; re-plan this model")
    w = weight.to_local(grad_placements=grads)
    b = bias.to_local(grad_placements=grads) if isinstance(bias, DTensor) else bias
    ignore_index = int(ce.get("ignore_index", -100))
    chunk = getattr(interp, "loss_chunk_tokens", None) or DEFAULT_CHUNK_TOKENS
    total = chunked_linear_cross_entropy(rows, w, b, y, ignore_index, chunk, _logits_dtype(loss))
    if int(ce.get("reduction", 1)) != _SUM:
        count = (y != ignore_index).sum().to(torch.float64).reshape(1)
        for a in axes:  # functional: traceable into the replayed program
            count = funcol.wait_tensor(funcol.all_reduce(count, "sum", mesh.get_group(a)))
        total = total / count.reshape(()).to(total.dtype)
    out = DTensor.from_local(total, mesh, grads, run_check=False, shape=(), stride=())
    return interp._check_and_reduce(loss, config, out, None)
