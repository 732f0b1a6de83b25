"""The blocks of a captured graph and the boundaries where a pipeline may cut it.

A *block* is one child of the model's largest numbered container (``model.layers.0``,
``model.layers.1``, ... from each operator's ``nn_module_stack`` path, the OpGraph's ``module``);
the operators before the first block (the embedding) and after the last (the final norm, the head
and the loss) are blocks too. An operator outside every block but between two of them belongs to
the block of its latest producer. A stage boundary may go between two consecutive blocks only where
exactly one activation tensor crosses it (one producer before the boundary feeds operators after
it; graph inputs are read by whichever stage needs them): that tensor is what one stage sends to the
next. Identical blocks (the same operators, shapes and wiring) make a stage's frontier depend only
on how many blocks it holds and whether it holds the first or the last one
(:attr:`Blocks.identical`).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import networkx as nx

from tensoropt.pipeline.schedules import PipelineError

_INDEXED = re.compile(r"^(.*?)\.(\d+)(?:\.|$)")


@dataclass
class Blocks:
    """A graph's blocks in order and where cuts may go.

    Example:
        >>> b = Blocks(["embedding", "layers.0", "head"], [{"x"}, {"y"}, {"z"}], [True, False], "layers",
        ...            {"embedding": "x"}, True)
        >>> b.count, b.can_cut(0), b.can_cut(1), b.can_cut(2)
        (3, True, False, True)
    """

    names: list[str]
    """A name per block: ``embedding``, the block's module path, ``head``."""
    nodes: list[set[str]]
    """The operators of each block (graph inputs not included)."""
    cuts: list[bool]
    """``cuts[i]``: a stage may end after block ``i`` (``len(names) - 1`` entries)."""
    container: str
    """The numbered container the blocks are the children of (``model.layers``)."""
    boundary: dict[str, str]
    """Block name -> the one operator whose output crosses the boundary after it (where one does)."""
    identical: bool
    """Every numbered block has the same operators, shapes and wiring."""
    first_is_block: bool = False
    """The first entry is a numbered block (the model has no embedding operators)."""
    last_is_block: bool = False
    """The last entry is a numbered block (no head operators)."""

    @property
    def count(self) -> int:
        """Number of blocks (embedding and head included)."""
        return len(self.names)

    def can_cut(self, after: int) -> bool:
        """Whether a stage may end after block ``after`` (``True`` for the last block)."""
        return after >= len(self.cuts) or self.cuts[after]


def find_blocks(graph) -> Blocks:
    """Split a captured graph into blocks and find the boundaries a pipeline may cut.

    Args:
        graph: an :class:`tensoropt.capture.OpGraph` (or its networkx graph).

    Returns:
        The :class:`Blocks`.

    Raises:
        PipelineError: no numbered container of at least two blocks (naming the top modules seen),
            or no boundary where exactly one tensor crosses (naming the block and the tensors).

    Example:
        >>> from tensoropt.config import Job
        >>> from tensoropt.planner import capture_job
        >>> job = Job(model={"name": "gpt", "kwargs": {"layers": 2, "width": 32, "heads": 2,
        ...           "seq_len": 8, "vocab_size": 64}}, cluster="cpu-local", devices=[1],
        ...           training={"global_batch_size": 2})
        >>> b = find_blocks(capture_job(job))
        >>> b.names, b.cuts, b.identical
        (['embedding', 'blocks.0', 'blocks.1', 'head'], [True, True, True], True)
    """
    g = graph.nx if hasattr(graph, "nx") else graph
    order = [n for n in nx.lexicographical_topological_sort(g) if g.nodes[n]["kind"] != "input"]
    container, index_of = _container(g, order)
    indices = sorted(set(index_of.values()))
    position = {i: k for k, i in enumerate(indices)}
    first = next(k for k, n in enumerate(order) if n in index_of)
    last = max(k for k, n in enumerate(order) if n in index_of)
    unit: dict[str, int] = {}
    for k, n in enumerate(order):  # 0: embedding, 1..B: blocks, B+1: head
        if n in index_of:
            unit[n] = position[index_of[n]] + 1
        elif k < first:
            unit[n] = 0
        elif k > last:
            unit[n] = len(indices) + 1
        else:
            unit[n] = max((unit[u] for u in g.predecessors(n) if u in unit), default=0)
    feeds_blocks: dict[str, bool] = {}
    for n in reversed(order):  # an operator before the blocks feeding none (the labels' pad) moves
        succ = [v for v in g.successors(n) if v in unit]  # to its first consumer's block (the loss's)
        feeds_blocks[n] = any(v in index_of for v in succ) or any(
            unit[v] == 0 and feeds_blocks.get(v, False) for v in succ)
        if unit[n] == 0 and n not in index_of and succ and not feeds_blocks[n]:
            unit[n] = min(unit[v] for v in succ)
    counts = Counter(unit.values())
    present = [u for u in range(len(indices) + 2) if counts[u]]
    names = {0: "embedding", len(indices) + 1: "head"}
    names.update({position[i] + 1: f"{container}.{i}" for i in indices})
    renumber = {u: k for k, u in enumerate(present)}
    nodes = [set() for _ in present]
    for n, u in unit.items():
        nodes[renumber[u]].add(n)
    cuts, boundary, crossing = [], {}, {}
    for k in range(len(present) - 1):
        sources = sorted(
            {
                u
                for u in g.nodes
                if unit.get(u, -1) != -1
                and renumber[unit[u]] <= k
                and any(unit.get(v, -1) != -1 and renumber[unit[v]] > k for v in g.successors(u))
            }
        )
        crossing[k] = sources
        cuts.append(len(sources) == 1)
        if len(sources) == 1:
            boundary[names[present[k]]] = sources[0]
    if not any(cuts):
        detail = "; ".join(
            f"after {names[present[k]]}: {', '.join(s) or 'none'}" for k, s in crossing.items()
        )
        raise PipelineError(
            f"model has no block boundary where a pipeline cut could go: at every boundary of "
            f"{container!r} other than one tensor crosses ({detail}); planner.pipeline: off"
        )
    return Blocks(
        [names[u] for u in present],
        nodes,
        cuts,
        container,
        boundary,
        _identical(g, [nodes[renumber[position[i] + 1]] for i in indices]),
        first_is_block=present[0] != 0,
        last_is_block=present[-1] != len(indices) + 1,
    )


def _container(g: nx.DiGraph, order: list[str]) -> tuple[str, dict[str, int]]:
    """The numbered module container holding the most operators, and each operator's index in it."""
    votes: Counter = Counter()
    found: dict[str, dict[str, int]] = {}
    for n in order:
        path = g.nodes[n].get("module") or ""
        for m in re.finditer(r"(?:^|\.)(\d+)(?=\.|$)", path):
            prefix = path[: m.start()] if m.start() else ""
            if not prefix:
                continue
            votes[prefix] += 1
            found.setdefault(prefix, {})[n] = int(m.group(1))
    ranked = [c for c, _ in votes.most_common() if len(set(found[c].values())) >= 2]
    if not ranked:
        tops = sorted({(g.nodes[n].get("module") or "<top>").split(".")[0] for n in order})
        raise PipelineError(
            f"model has no block boundary where a pipeline cut could go: no numbered container of "
            f"blocks (such as layers.0, layers.1) among its modules {tops}; planner.pipeline: off"
        )
    return ranked[0], found[ranked[0]]


def block_order(g: nx.DiGraph, nodes: set[str]) -> list[str]:
    """A block's operators in the graph's own order (torch.export's, a topological one): identical
    blocks list corresponding operators at the same positions, whatever their names.

    Example:
        >>> g = nx.DiGraph([("linear_9", "add_9"), ("add_9", "linear_10")])
        >>> block_order(g, {"linear_10", "linear_9", "add_9"})
        ['linear_9', 'add_9', 'linear_10']
    """
    return [n for n in g.nodes if n in nodes]


def _identical(g: nx.DiGraph, blocks: list[set[str]]) -> bool:
    """Whether the numbered blocks have the same operators, shapes and internal wiring, in order."""

    def signature(nodes: set[str]) -> tuple:
        order = block_order(g, nodes)
        index = {n: k for k, n in enumerate(order)}
        return tuple(
            (
                g.nodes[n]["op"],
                tuple(g.nodes[n]["out_shape"]),
                tuple(tuple(s) for s in g.nodes[n]["params"].values()),
                tuple(sorted(index.get(u, -1) for u in g.predecessors(n))),
            )
            for n in order
        )

    return len({signature(b) for b in blocks}) <= 1
