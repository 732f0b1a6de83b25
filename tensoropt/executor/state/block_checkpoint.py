"""Whole-block activation checkpointing in the executor: ``block_recompute`` and ``block_selective``.

What they mean and cost: :mod:`estimators.block_options`. A plan gives the option to every
operator of a block (its blocks: :func:`estimators.block_options.find_blocks` over the exported
graph's module paths and the job's ``training.checkpoint_modules``, as the planner found them).
The interpreter (:class:`tensoropt.executor.program.interpreter.PlanInterpreter`) runs, at a block's first
node, the block's whole span of the graph (every node from its first to its last, views
included) as one function under ``torch.utils.checkpoint`` (non-reentrant) and fills its
environment with the values the rest of the graph reads; the nodes of the span are then skipped.

* ``block_recompute``: plain non-reentrant checkpoint: the span's inputs are kept (the values it
  reads from outside, the parameters' compute-dtype copies among them), everything the span's
  operators save is dropped and rebuilt by running the span again when backward reaches it.
* ``block_selective``: the same with ``context_fn`` = ``create_selective_checkpoint_contexts``
  of torchtitan's op-level policy: the outputs of the matmul-class ops and of attention
  (:data:`SAVED_OPS`) are saved, the rest recomputed.

The span's function returns only the values the outside reads (a lazy view the outside reads: its
computed root); the rest of what it computes dies when it returns, apart from what the checkpoint
keeps. Forward and the rerun in backward each run with a redistribution memo of their own (dropped
when the span ends: the views it made die with it) and make the same ops in the same order, so the
rerun replays under ``make_fx`` (the replay mode's trace) as in eager mode. The interpreter's loop
skips the span's other nodes, and so the frees at them: :func:`run_block` drops the outside values
last read inside the span itself (the checkpoint holds what its rerun needs).

Example:
    >>> spans = block_spans(graph_module.graph, placements, checkpoint_modules=None)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from estimators.block_options import BlockError, block_option, find_blocks
from tensoropt.capture.fxroles import module_of
from tensoropt.configspace.configuration import Configuration

_aten = torch.ops.aten


def _saved_ops() -> frozenset:
    names = ("mm", "addmm", "bmm", "baddbmm", "convolution", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
             "_scaled_dot_product_flash_attention_for_cpu")
    return frozenset(getattr(_aten, n).default for n in names if hasattr(_aten, n))


SAVED_OPS: frozenset = _saved_ops()
"""The aten ops whose outputs ``block_selective`` saves (torchtitan's op-level policy)."""


def _policy(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


class BlockSpan:
    """One checkpointed block: its option, its span of graph nodes, what it reads and what is read of it."""

    def __init__(self, name: str, option: str, nodes: list[fx.Node], lazy: set[str]):
        self.name, self.option, self.nodes = name, option, nodes
        inside = set(nodes)
        inputs: dict[fx.Node, None] = {}
        for n in nodes:
            for a in n.all_input_nodes:
                while a not in inside and a not in inputs:
                    inputs[a] = None
                    if a.name not in lazy or not isinstance(a.args[0], fx.Node):
                        break
                    a = a.args[0]  # a lazy view outside: its chain down to a computed value
        self.inputs = list(inputs)
        """Nodes outside the span that it reads (lazy views outside: their values are markers)."""
        needed: set[fx.Node] = set()
        for n in reversed(nodes):  # read outside, directly or through a lazy view the outside reads
            # (only a lazy view passes the need on: a computed node the outside reads is returned
            # itself, its operands stay inside and are freed when the span's function returns)
            if any(u not in inside or (u in needed and u.name in lazy) for u in n.users):
                needed.add(n)
                if n.name in lazy and isinstance(n.args[0], fx.Node):
                    needed.add(n.args[0])
        self.returned = [n for n in nodes if n in needed and n.name not in lazy]
        """Nodes whose values the span returns."""
        self.lazy_out = [n for n in nodes if n in needed and n.name in lazy]
        """Lazy view nodes of the span the outside reads (markers; replayed from a returned root)."""


def block_spans(graph: fx.Graph, placements: dict[str, Configuration], lazy: set[str],
                checkpoint_modules: Sequence[str] | None = None) -> dict[fx.Node, BlockSpan]:
    """First node of each checkpointed block -> its :class:`BlockSpan` (empty: no block option).

    Raises:
        BlockError: a block whose operators disagree on the option (the plan was not made for this
            graph's blocks), or whose span overlaps another block's.

    Example:
        >>> block_spans(fx.Graph(), {}, set())
        {}
    """
    if not any(block_option(c) for c in placements.values()):
        return {}
    order = list(graph.nodes)
    modules = {n.name: module_of(n) for n in order if n.op == "call_function" and n.name in placements}
    blocks = find_blocks(modules, checkpoint_modules)
    position = {n.name: i for i, n in enumerate(order)}
    out: dict[fx.Node, BlockSpan] = {}
    taken = -1
    for name, members in sorted(blocks.items(), key=lambda kv: min(position[m] for m in kv[1])):
        options = {block_option(placements[m]) for m in members}
        if options == {None}:
            continue
        if len(options) > 1:
            raise BlockError(f"block {name!r}: its operators carry different block options "
                             f"{sorted(map(str, options))}; the plan was made for other blocks "
                             "(check training.checkpoint_modules)")
        first, last = min(position[m] for m in members), max(position[m] for m in members)
        if first <= taken:
            raise BlockError(f"block {name!r} overlaps the block before it in the graph's order; "
                             "training.checkpoint_modules must name disjoint modules")
        taken = last
        span = [n for n in order[first:last + 1] if n.op == "call_function"]
        out[order[first]] = BlockSpan(name, options.pop(), span, lazy)
    return out


def _report_saved(caching_mode) -> None:
    """Show the outputs a selective checkpoint saved (its cache) to the saved-tensor hooks active
    around the block, as autograd's saved tensors are: the trainer's memory measurement
    (:class:`tensoropt.executor.state.memory.SavedTensors`) counts them as held."""
    hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
    storage = getattr(caching_mode, "storage", None)
    if not hooks or not storage:
        return
    for per_call in storage.values():  # op -> {call index: a _VersionWrapper of its outputs}
        entries = per_call.values() if isinstance(per_call, dict) else per_call
        for entry in entries:
            for t in pytree.tree_leaves(getattr(entry, "val", entry)):
                if isinstance(t, torch.Tensor):
                    hooks[0](t)


def _as_in_eager():
    """A context under which a selective checkpoint follows its policy under the replay mode's
    ``make_fx`` trace as it does in eager mode.

    Under a proxy mode torch's selective checkpoint takes the trace for a compile's
    (``torch.utils.checkpoint._is_compiling``): it caches *every* op's output, marks the nodes with the
    policy and leaves the recompute decision to a compiler's partitioner. The rerun traced in backward
    then reads every cached output and recomputes nothing, and the replayed program, which no
    partitioner rewrites, held each block's whole forward from its forward to its backward (the fp32
    replayed steps' resident peak 7-37 % above the plain plan's, docs/results.md ``selsolve2``). Inside
    ``torch.compiler._non_strict_tracing_context`` (a non-strict ``make_fx`` trace: ours) it follows the
    policy as in eager mode: the matmul-class and attention outputs cached, the rest rerun. Without that
    context (an older torch), nothing changes.

    Example:
        >>> with _as_in_eager():
        ...     pass
    """
    tracing = getattr(torch.compiler, "_non_strict_tracing_context", None)
    return tracing() if tracing is not None else contextlib.nullcontext()


def run_block(interp, span: BlockSpan, lazy_marker: Any) -> Any:
    """Run ``span`` under checkpoint; returns its first node's value and fills ``interp.env`` for the rest.

    Example:
        >>> value = run_block(interpreter, span, _LAZY)  # needs a PlanInterpreter  # doctest: +SKIP
    """
    outer = interp.env
    values = [outer[a] for a in span.inputs]

    def fn(*args):
        saved_env, saved_memo = interp.env, interp._memo
        env = dict(zip(span.inputs, args))
        interp.env, interp._memo = env, {}  # the block's own memo: its views die with it (see the module doc)
        interp._in_block = True
        try:
            for n in span.nodes:
                env[n] = interp.run_node(n)
                for used in interp.user_to_last_uses.get(n, ()):  # freed as the interpreter's loop frees:
                    env.pop(used, None)  # the rerun holds what autograd saves, not the whole block
        finally:
            interp._in_block = False
            interp.env, interp._memo = saved_env, saved_memo
        return tuple(env[n] for n in span.returned)

    kwargs, contexts = {}, []
    if span.option == "block_selective":
        def context_fn():
            pair = create_selective_checkpoint_contexts(_policy)
            contexts.append(pair[0])
            return pair

        kwargs["context_fn"] = context_fn
    with _as_in_eager() if span.option == "block_selective" else contextlib.nullcontext():
        results = checkpoint(fn, *values, use_reentrant=False, **kwargs)
    if contexts:
        _report_saved(contexts[0])
    for n, value in zip(span.returned, results):
        outer[n] = value
    for n in span.lazy_out:
        outer[n] = lazy_marker
    for n in span.nodes[1:]:  # the rest of the span is done: the interpreter's loop skips them
        outer.setdefault(n, None)
    inside = set(span.nodes)
    for n in span.nodes[1:]:  # and so frees nothing at them: drop the outside values last read there
        for used in interp.user_to_last_uses.get(n, ()):  # (the checkpoint keeps what its rerun needs)
            if used not in inside:
                outer.pop(used, None)
    first = span.nodes[0]
    return outer.pop(first) if first in outer else None


__all__ = ["SAVED_OPS", "BlockError", "BlockSpan", "block_spans", "run_block"]
