"""The pipelined frontier of one device count: stage frontiers by the FT solve, the DP across stages.

For ``p`` stages, ``m`` micro-batches and a schedule, on ``D`` devices:

1. The model is captured at the micro-batch size ``B / m`` and priced on ``D / p`` devices (one
   cost graph: every stage has the same mesh).
2. A stage holding blocks ``[f, l]`` (:mod:`tensoropt.pipeline.stages`) is the cost graph's
   operators of those blocks, plus the operator that produced the tensor it receives (its
   configurations stand for the layout the tensor arrives in, priced as the receive and the
   gradient's send back, :func:`estimators.pipeline.p2p_time_s`); the operator whose output crosses
   to the next stage pays the send and the gradient's receive. Memory is each operator's state
   (parameters, gradients, optimizer state) plus ``k_s`` times its activations, ``k_s`` the
   micro-batches the schedule keeps in flight on the stage (:mod:`tensoropt.pipeline.schedules`,
   torch's order). Time is per micro-batch; each configuration's once-per-step part
   (:func:`estimators.pipeline.once_per_step_s`) is kept apart as ``d`` and counted ``1 / m`` per
   micro-batch in the stage's solve (its share of the step). The schedule's own host time per
   micro-batch (:func:`estimators.pipeline.schedule_overhead_s`, measured) is added to each
   stage's time per micro-batch. A stage option's memory is what the stage holds
   (:mod:`tensoropt.pipeline.stage_memory`: the state, ``k_s`` micro-batches of activations with the
   output kept to send, the receive buffers torch keeps per micro-batch); its tensor peak adds the
   largest transient (``pipeline_detail.stages[s].peak_bytes``). A tied weight whose two users
   fall in different stages (GPT-2's embedding and head) adds its copy's state and once-per-step
   work to the stage of its other user, and the all-reduce of its gradient between the two stages to
   both stages' once-per-step part (:mod:`tensoropt.pipeline.tied_stages`).
3. The stage's intra-operator frontier is the FT solve of that graph (``solve``: the planner's,
   memory options included), thinned to at most ``max_options`` plans with a proven cover.
4. :func:`frontier.pipeline.pipeline_frontier` combines the stage options exactly:
   ``T = (m - 1) max t_s + sum t_s + max d_s``, memory ``max_s w_s``.

Identical blocks make a stage's options depend only on (blocks held, holds the first block, holds
the last, ``k_s``): they are computed once per such key (:class:`StageSolver`). Without the stage
chain a middle stage's options are the union of its frontiers at its own ``k_s`` and at the least
and the most in-flight count of the middle positions, each plan re-priced at ``k_s``. With the stage
chain (:class:`tensoropt.pipeline.chain_stages.StageChain`) a stage is solved at its own ``k_s``;
with a range of in-flight counts (``ChainSettings.in_flight``) one set of tables in (time, memory
at the range's least count, memory at its most) is projected to each ``k``. Large models keep
stage sizes within ``balance`` blocks of the even split (:func:`stage_sizes`).

``Interleaved1F1B`` cuts the chain into ``2 p`` virtual stages (rank ``r`` holds ``r`` and
``r + p``), each priced as above at its own in-flight count from torch's interleaved order (solved
exactly at that count: no middle-stage union), and
:func:`frontier.pipeline_interleaved.interleaved_frontier` combines them per rank:
``T = (m - 1/2) max_r tau_r + (1/2) sum_s t_s + max_r D_r``, memory ``max_r W_r``, where a rank's
``tau``, ``D``, ``W`` sum its two virtual stages.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from estimators.dtypes import itemsize as itemsize_of
from estimators.memory_parts import STATE_PARTS
from estimators.op_costs import CostModel
from estimators.pipeline import once_per_step_s, p2p_time_s, schedule_overhead_s
from estimators.tied import tied_pairs
from frontier.pipeline import PipelinePoint, bubble_fraction, pipeline_frontier
from frontier.pipeline_interleaved import interleaved_bubble_fraction, interleaved_frontier
from tensoropt.configspace.configuration import local_shape
from tensoropt.pipeline.chain_stages import ChainSettings, StageChain
from tensoropt.pipeline.in_flight_memory import split_memory
from tensoropt.pipeline.schedules import in_flight_micro_batches, stages_per_rank
from tensoropt.pipeline.stage_memory import StageMemory, stage_memory
from tensoropt.pipeline.stage_walk import backward_excess_bytes
from tensoropt.pipeline.stages import Blocks, block_order
from tensoropt.pipeline.tied_stages import StageTie, add_tied_terms, stage_ties

#: Models of more blocks than this keep each stage within ``BALANCE`` blocks of the even split.
ALL_SIZES_UP_TO = 16
BALANCE = 1


@dataclass
class StageOption:
    """One intra-operator plan of a stage: its assignment and its (t, d, w)."""

    assignment: dict[str, int]
    time_s: float
    """Per micro-batch, sends and receives included."""
    step_s: float
    """Once per step (gradient sync, optimizer)."""
    memory_bytes: float
    """What the stage holds (:attr:`tensoropt.pipeline.stage_memory.StageMemory.held_bytes`): its
    state, its in-flight micro-batches of activations, the receive buffers."""


@dataclass
class PipelinedPlan:
    """One point of a pipelined frontier with everything a plan entry shows."""

    point: PipelinePoint
    stages: int
    schedule: str
    micro_batches: int
    block_names: list[str]
    in_flight: list[int]
    options: list[StageOption] = field(default_factory=list)

    @property
    def chunks(self) -> int:
        """Virtual stages per rank (2 for ``Interleaved1F1B``, else 1)."""
        return len(self.point.blocks) // self.stages

    @property
    def bubble(self) -> float:
        """Bubble fraction of the step's micro-batch phase (:func:`frontier.pipeline.bubble_fraction`,
        :func:`frontier.pipeline_interleaved.interleaved_bubble_fraction` for interleaved plans)."""
        if self.chunks > 1:
            return interleaved_bubble_fraction(self.point.max_t, self.point.sum_t, self.micro_batches,
                                               self.chunks)
        return bubble_fraction(self.point.max_t, self.point.sum_t, self.micro_batches)

    def rank_memory_bytes(self) -> list[float]:
        """Memory per device of each pipeline rank: the sum of its virtual stages' (one stage unless
        interleaved).

        Example:
            >>> from frontier.pipeline import PipelinePoint
            >>> p = PipelinedPlan(PipelinePoint(1.0, 5.0, [(0, 0), (1, 1), (2, 2), (3, 3)], [0] * 4), 2,
            ...                   "Interleaved1F1B", 2, ["e", "l.0", "l.1", "h"], [2, 2, 2, 1],
            ...                   [StageOption({}, 0.1, 0.0, w) for w in (1.0, 2.0, 3.0, 4.0)])
            >>> p.rank_memory_bytes()
            [4.0, 6.0]
        """
        out = [0.0] * self.stages
        for s, o in enumerate(self.options):
            out[s % self.stages] += o.memory_bytes
        return out

    def pipeline_json(self) -> dict:
        """The plan entry's ``"pipeline"`` (the contract of issue 27, exactly these keys).

        Example:
            >>> p = PipelinedPlan(PipelinePoint(1.0, 2.0, [(0, 1), (2, 3)], [0, 0]), 2, "1F1B", 4,
            ...                   ["embedding", "l.0", "l.1", "head"], [2, 1])
            >>> p.pipeline_json()
            {'stages': 2, 'schedule': '1F1B', 'micro_batches': 4, 'blocks': [[0, 1], [2, 3]]}
        """
        return {
            "stages": self.stages,
            "schedule": self.schedule,
            "micro_batches": self.micro_batches,
            "blocks": [[a, b] for a, b in self.point.blocks],
        }

    def stages_json(self, devices: int) -> list[dict]:
        """Per (virtual) stage: its blocks by name, its rank and devices, in-flight count, time,
        once-per-step time, memory (the stage's own; a rank holds ``rank_memory_bytes``)."""
        per = devices // self.stages
        rank_memory = self.rank_memory_bytes()
        return [
            {
                "stage": s,
                "rank": s % self.stages,
                "rank_memory_bytes": rank_memory[s % self.stages],
                "blocks": [a, b],
                "first": self.block_names[a],
                "last": self.block_names[b],
                "devices": [(s % self.stages) * per, (s % self.stages + 1) * per - 1],
                "in_flight": self.in_flight[s],
                "time_s": o.time_s,
                "step_s": o.step_s,
                "memory_bytes": o.memory_bytes,
            }
            for s, ((a, b), o) in enumerate(zip(self.point.blocks, self.options))
        ]


def stage_sizes(num_blocks: int, num_stages: int, balance: int = BALANCE) -> list[int]:
    """Block counts a stage may hold: any for small models, else within ``balance`` of the even split.

    Example:
        >>> stage_sizes(6, 2), stage_sizes(82, 8)
        ([1, 2, 3, 4, 5], [9, 10, 11, 12])
    """
    if num_blocks <= ALL_SIZES_UP_TO:
        return list(range(1, num_blocks - num_stages + 2))
    low, high = num_blocks // num_stages, -(-num_blocks // num_stages)
    return list(range(max(1, low - balance), high + balance + 1))


class StageSolver:
    """Stage options of one (cost graph, stage count, micro-batches), cached by identical-block key.

    Args:
        G: the cost graph of the micro-batch on ``devices / p`` devices
            (:func:`tensoropt.planner.job_cost_graph`).
        graph: the OpGraph it was priced from (shapes and parameters).
        blocks: :func:`tensoropt.pipeline.stages.find_blocks` of ``graph``.
        micro_batches: ``m``.
        solve: ``solve(stage_graph) -> list of frontier points`` (the planner's FT solve and thinning).
        chain: where given and the model qualifies (:meth:`StageChain.applies`), stage frontiers
            come from one transfer table per block kind and one sweep per start
            (:class:`tensoropt.pipeline.chain_stages.StageChain`) instead of ``solve``.
    """

    def __init__(
        self, G: nx.DiGraph, graph, blocks: Blocks, micro_batches: int, solve: Callable[[nx.DiGraph], list],
        chain: ChainSettings | None = None,
    ):
        self.G, self.graph, self.blocks, self.m, self.solve = G, graph, blocks, micro_batches, solve
        g = graph.nx if hasattr(graph, "nx") else graph
        self.g = g
        cluster, mesh = G.graph["cluster"], G.graph["mesh"]
        self.devices = mesh.num_devices
        model = CostModel(
            cluster, mesh, G.graph.get("optimizer", "adamw"), precision=G.graph.get("precision", "fp32")
        )
        self.cost_model = model
        """The cost model of the stage mesh (what :mod:`tensoropt.pipeline.tied_stages` prices with)."""
        self.tie_pairs = tied_pairs(g)
        """Every tied parameter's (first user, other user, key) (:func:`estimators.tied.tied_pairs`)."""
        self._ties: dict[tuple[int, int], list[StageTie]] = {}
        self.step_s: dict[str, np.ndarray] = {}
        self.p2p_s: dict[str, np.ndarray] = {}
        self.boundary_bytes: dict[str, np.ndarray] = {}
        """Local bytes of each crossing tensor per configuration of its producer."""
        self._out_bytes: dict[str, np.ndarray] = {}
        crossing = set(blocks.boundary.values())
        for n in G.nodes:
            d = G.nodes[n]
            if d["kind"] == "input":
                continue
            confs = d["configurations"]
            step = np.array([once_per_step_s(model, g.nodes[n], c) for c in confs])
            # never more than the configuration's time (a ZeRO variant prices its own synchronisation)
            self.step_s[n] = np.clip(step, 0.0, np.maximum(d["cost"][:, 0], 0.0))
            if n in crossing:  # forward: the activation; backward: its gradient
                self.boundary_bytes[n] = self.out_bytes(n)
                self.p2p_s[n] = np.array([2 * p2p_time_s(cluster, float(b), self.devices)
                                          for b in self.boundary_bytes[n]])
        self.schedule_s = schedule_overhead_s(cluster, 2)
        """What torch's schedule adds per micro-batch on a stage (a measured constant of the device)."""
        self.cache: dict[tuple, list] = {}
        self._canonical: dict[tuple[int, int], list[str]] = {}
        self._block_orders: dict[int, list[str]] = {}
        self._reads: dict[tuple, tuple] = {}
        self._walked: dict[tuple, StageMemory] = {}
        self._config_json: dict[tuple[str, int], dict] = {}
        self.solves = 0
        self.chain = StageChain(self, chain) if chain is not None and StageChain.applies(self) else None

    def out_bytes(self, n: str) -> np.ndarray:
        """Local bytes of operator ``n``'s output under each of its configurations."""
        if n not in self._out_bytes:
            d, mesh = self.g.nodes[n], self.G.graph["mesh"]
            shape, dtype = tuple(d["out_shape"]), str(d.get("out_dtype", "float32"))
            self._out_bytes[n] = np.array(
                [float(np.prod(local_shape(shape, c.output, mesh.shape))) * itemsize_of(dtype)
                 for c in self.G.nodes[n]["configurations"]])
        return self._out_bytes[n]

    def configuration_json(self, n: str, c: int) -> dict:
        """Configuration ``c`` of node ``n`` as JSON, built once per (node, configuration) for every
        plan of this stage mesh (shared: read only)."""
        if (n, c) not in self._config_json:
            self._config_json[n, c] = self.G.nodes[n]["configurations"][c].to_json()
        return self._config_json[n, c]

    def key(self, first: int, last: int, in_flight: int) -> tuple:
        """What a stage's options depend on: with identical blocks, not which blocks (only how many,
        whether it holds the first or the last, whether it receives the first block's output)."""
        b = self.blocks
        if not b.identical:
            return (first, last, in_flight)
        holds_first, holds_last = first == 0, last == b.count - 1
        after_first = first == 1  # receives the first block's output (the embedding's, not a block's)
        ties = tuple((t.key, t.role) for t in self.ties(first, last))  # tied weights across stages
        return (last - first + 1, holds_first, holds_last, after_first, in_flight) + ((ties,) if ties else ())

    def ties(self, first: int, last: int) -> list[StageTie]:
        """The tied parameters the stage ``[first, last]`` holds one user of, the other user in
        another stage (:func:`tensoropt.pipeline.tied_stages.stage_ties`)."""
        if not self.tie_pairs:
            return []
        if (first, last) not in self._ties:
            nodes = set().union(*self.blocks.nodes[first : last + 1])
            self._ties[first, last] = stage_ties(self.g, nodes, self.tie_pairs)
        return self._ties[first, last]

    def canonical(self, first: int, last: int) -> list[str]:
        """The stage's nodes in an order that identical stages share: the received tensor's
        producer, each block's operators in graph order (:func:`block_order`), the graph inputs read
        (computed once per stage; the caller must not change the list)."""
        if (first, last) not in self._canonical:
            b, G = self.blocks, self.G
            nodes = [n for i in range(first, last + 1) for n in self._block_order(i)]
            inputs = sorted({u for n in nodes for u in G.predecessors(n) if G.nodes[u]["kind"] == "input"})
            received = [b.boundary[b.names[first - 1]]] if first > 0 else []
            self._canonical[first, last] = received + nodes + inputs
        return self._canonical[first, last]

    def _block_order(self, i: int) -> list[str]:
        """Block ``i``'s operators in graph order (:func:`block_order`), once per block."""
        if i not in self._block_orders:
            self._block_orders[i] = block_order(self.g, self.blocks.nodes[i])
        return self._block_orders[i]

    def options(
        self, first: int, last: int, in_flight: int, other_in_flight: tuple[int, ...] = (),
    ) -> list[StageOption]:
        """The options of the stage ``[first, last]`` holding ``in_flight`` micro-batches.

        ``other_in_flight``: further counts whose exact frontiers are solved too and re-priced at
        ``in_flight`` (the union's Pareto set is kept); ignored where the stage chain builds the
        frontier (its frontier at ``in_flight`` is exact up to its printed bound). Options are cached
        by :meth:`key` as configuration vectors over :meth:`canonical`, so identical stages
        elsewhere reuse them.
        """
        names = self.canonical(first, last)
        return [StageOption(dict(zip(names, v)), *row)
                for v, row in self._entries(first, last, in_flight, other_in_flight)]

    def option_costs(self, first: int, last: int, in_flight: int,
                     other_in_flight: tuple[int, ...] = ()) -> np.ndarray:
        """The ``(t, d, w)`` rows of :meth:`options`, in its order, without building the options'
        assignments (what the DP across stages reads)."""
        return np.array([row for _, row in self._entries(first, last, in_flight, other_in_flight)],
                        dtype=np.float64).reshape(-1, 3)

    def option(self, first: int, last: int, in_flight: int, row: int,
               other_in_flight: tuple[int, ...] = ()) -> StageOption:
        """Option ``row`` of :meth:`options` alone."""
        vector, costs = self._entries(first, last, in_flight, other_in_flight)[row]
        return StageOption(dict(zip(self.canonical(first, last), vector)), *costs)

    def _entries(self, first: int, last: int, in_flight: int, other_in_flight: tuple[int, ...] = ()
                 ) -> list[tuple[tuple[int, ...], tuple[float, float, float]]]:
        """The cached (configuration vector over :meth:`canonical`, (t, d, w)) of each option."""
        from frontier.pareto import pareto_select

        key = self.key(first, last, in_flight)
        if key not in self.cache:
            names = self.canonical(first, last)
            whole = first == 0 and last == self.blocks.count - 1
            vectors = []
            if self.chain is not None and not whole:
                other_in_flight = ()  # the chain's frontier at in_flight is exact (or its shared tables')
            for k in sorted({in_flight, *other_in_flight}):
                vectors += self._solved(first, last, k)
            vectors = list(dict.fromkeys(vectors))
            rows = [self._cost(first, last, in_flight, dict(zip(names, v))) for v in vectors]
            if rows:
                arr = np.array(rows)
                keep = pareto_select(np.stack([arr[:, 0] + arr[:, 1] / self.m, arr[:, 2]], axis=1))
                self.cache[key] = [(vectors[i], tuple(map(float, arr[i]))) for i in keep]
            else:
                self.cache[key] = []
        return self.cache[key]

    def _solved(self, first: int, last: int, k: int) -> list[tuple[int, ...]]:
        """The stage's thinned FT frontier at ``k`` in flight, as vectors over :meth:`canonical`."""
        key = ("solved", *self.key(first, last, k))
        whole = first == 0 and last == self.blocks.count - 1
        if key not in self.cache and self.chain is not None and not whole:
            self.cache[key] = self.chain.vectors(first, last, k)
        if key not in self.cache:
            H = self._stage_graph(first, last, k)
            names = self.canonical(first, last)
            points = self.solve(H)
            self.solves += 1
            self.cache[key] = [tuple(int(p.assignment[n]) for n in names) for p in points]
        return self.cache[key]

    def _stage_graph(self, first: int, last: int, k: int | tuple[int, int]) -> nx.DiGraph:
        """The stage's cost graph: time per micro-batch (+ d / m), memory state + k x activations.

        ``k = (k1, k2)``: three objectives, (time, memory at ``k1``, memory at ``k2``)
        (:func:`split_memory`): the stage chain keeps one set of tables for every in-flight count
        of the range (:class:`tensoropt.pipeline.chain_stages.StageChain`)."""
        G, b = self.G, self.blocks
        nodes = set().union(*b.nodes[first : last + 1])
        inputs = {u for n in nodes for u in G.predecessors(n) if G.nodes[u]["kind"] == "input"}
        received = b.boundary.get(b.names[first - 1]) if first > 0 else None
        sent = b.boundary.get(b.names[last]) if last < b.count - 1 else None
        keep = nodes | inputs | ({received} if received else set())
        H = nx.DiGraph()
        H.graph.update(G.graph)
        H.graph["pipeline_stage"] = (received, sent, k)
        for n in G.nodes:
            if n not in keep:
                continue
            d = G.nodes[n]
            cost = d["cost"].copy()
            if n == received:  # stands for the received tensor: its layout, the receive, no work
                cost[:, 0] = self.p2p_s[n]
                cost[:, 1] = 0.0
                step = np.zeros(len(cost))
            else:
                step = self.step_s.get(n, np.zeros(len(cost)))
                state = sum(d[p] for p in STATE_PARTS) if d["kind"] != "input" else 0.0
                if d["kind"] != "input":  # activations: what memory holds beyond the state
                    cost = split_memory(cost, state, np.maximum(d["memory_bytes"] - state, 0.0), k)
                else:
                    cost = split_memory(cost, 0.0, cost[:, 1], k)
                cost[:, 0] = cost[:, 0] - step + step / self.m
                if n == sent:
                    cost[:, 0] += self.p2p_s[n]
            if isinstance(k, tuple) and cost.shape[-1] == 2:  # the received tensor: no memory
                cost = split_memory(cost, 0.0, cost[:, 1], k)
            H.add_node(n, **{**d, "cost": cost, "step_s": step})
        add_tied_terms(H, self.ties(first, last), self.g, self.cost_model, self.m, self.devices)
        for u, v, e in G.edges(data=True):
            if u in keep and v in keep and v != received:
                cost = split_memory(e["cost"].copy(), 0.0, e["cost"][..., 1], k)
                H.add_edge(u, v, **{**e, "cost": cost})
        return H

    def _price(self, H: nx.DiGraph, assignment: dict[str, int]) -> tuple[float, float, float]:
        """(t, d, w) of an assignment on the stage graph ``H`` (w: :meth:`memory`'s held bytes)."""
        total = 0.0
        step = 0.0
        for n, c in assignment.items():
            total += float(H.nodes[n]["cost"][c, 0])
            step += float(H.nodes[n]["step_s"][c])
        for u, v, e in H.edges(data=True):
            total += float(e["cost"][assignment[u], assignment[v], 0])
        held = self._memory(H, assignment).held_bytes
        return total - step / self.m + self.schedule_s, step, float(held)

    def memory(self, first: int, last: int, in_flight: int, assignment: dict[str, int]) -> StageMemory:
        """The stage ``[first, last]``'s memory by part under ``assignment``, ``in_flight`` micro-batches
        kept (:mod:`tensoropt.pipeline.stage_memory`), its backward transient walked in backward order
        (:meth:`backward_excess_bytes`; the frontier search's sums carry only the held bytes), once
        per (stage, ``k``, configuration vector) over :meth:`canonical` (the kept plans share stage
        options)."""
        if list(assignment) != self.canonical(first, last):
            return self._sums(first, last, in_flight, assignment, walk=True)[3]
        key = (first, last, in_flight, tuple(assignment.values()))
        if key not in self._walked:
            self._walked[key] = self._sums(first, last, in_flight, assignment, walk=True)[3]
        return self._walked[key]

    def backward_excess_bytes(self, first: int, last: int, assignment: dict[str, int],
                              grads_of: nx.DiGraph | None = None) -> float:
        """What one micro-batch's backward adds to what the stage ``[first, last]`` holds under
        ``assignment``, walked over its operators in backward order (the reverse of
        :meth:`canonical`'s, a topological one): :func:`tensoropt.pipeline.stage_walk.backward_excess_bytes`.
        ``grads_of``: the graph whose ``grad_bytes`` to read (a stage graph with a tied copy's
        gradient, :mod:`tensoropt.pipeline.tied_stages`), else the cost graph.

        Example:
            >>> # tests/pipeline_runtime/test_stage_walk.py: against a stage's measured backward
            >>> True
            True
        """
        b = self.blocks
        received = b.boundary.get(b.names[first - 1]) if first > 0 else None
        sent = b.boundary.get(b.names[last]) if last < b.count - 1 else None
        return backward_excess_bytes(self.G, self.canonical(first, last), assignment, self.out_bytes,
                                     received, sent, grads_of, self.g)

    def _cost(self, first: int, last: int, in_flight: int,
              assignment: dict[str, int]) -> tuple[float, float, float]:
        """(t, d, w) of an assignment of the stage, as :meth:`_price` prices it on the stage graph."""
        time_s, step_s, _, memory = self._read(first, last, in_flight, assignment)
        return time_s - step_s / self.m + self.schedule_s, step_s, float(memory.held_bytes)

    def _read(self, first: int, last: int, k: int, assignment: dict[str, int]
              ) -> tuple[float, float, float, StageMemory]:
        """:meth:`_sums`, once per (stage, k, configuration vector) for an assignment over
        :meth:`canonical` in its order (the options of a stage and the breakdown of every kept plan
        holding that option read the same sums; shared: read only)."""
        if list(assignment) != self.canonical(first, last):
            return self._sums(first, last, k, assignment)
        key = (first, last, k, tuple(assignment.values()))
        if key not in self._reads:
            self._reads[key] = self._sums(first, last, k, assignment)
        return self._reads[key]

    def _sums(self, first: int, last: int, k: int, assignment: dict[str, int], walk: bool = False
              ) -> tuple[float, float, float, StageMemory]:
        """(time, once-per-step time, memory, memory by part) of an assignment of the stage ``[first,
        last]`` at ``k`` in flight: the sums of its stage graph's entries (:meth:`_stage_graph`; time
        and memory as its frontier solve counts them), read off the cost graph entry by entry, no
        stage graph built (the options of every stage and the breakdown of every kept plan read
        them); a stage holding one user of a tied weight builds its stage graph
        (:mod:`tensoropt.pipeline.tied_stages`). ``walk``: the backward transient walked in order
        (:meth:`backward_excess_bytes`), else bounded by twice the largest output (the search reads
        only the held bytes)."""
        if self.ties(first, last):
            H = self._stage_graph(first, last, k)
            time_s = step_s = 0.0
            for n, c in assignment.items():
                time_s += float(H.nodes[n]["cost"][c, 0])
                step_s += float(H.nodes[n]["step_s"][c])
            for u, v, e in H.edges(data=True):
                time_s += float(e["cost"][assignment[u], assignment[v], 0])
            total = float(sum(H.nodes[n]["cost"][c, 1] for n, c in assignment.items())
                          + sum(e["cost"][assignment[u], assignment[v], 1] for u, v, e in H.edges(data=True)))
            backward = self.backward_excess_bytes(first, last, assignment, grads_of=H) if walk else None
            return time_s, step_s, total, self._memory(H, assignment, backward)
        G, b = self.G, self.blocks
        received = b.boundary.get(b.names[first - 1]) if first > 0 else None
        sent = b.boundary.get(b.names[last]) if last < b.count - 1 else None
        time_s = step_s = total = state = grads = largest_param = largest_out = received_saved = 0.0
        for n, c in assignment.items():
            d = G.nodes[n]
            if n == received:
                time_s += float(self.p2p_s[n][c])
                continue
            if d["kind"] == "input":
                time_s += float(d["cost"][c, 0])
                total += k * float(d["cost"][c, 1])
                continue
            step = float(self.step_s[n][c]) if n in self.step_s else 0.0
            time_s += float(d["cost"][c, 0]) - step + step / self.m
            if n == sent:
                time_s += float(self.p2p_s[n][c])
            step_s += step
            own = float(sum(d[p][c] for p in STATE_PARTS))
            total += own + k * max(float(d["memory_bytes"][c]) - own, 0.0)
            state += own
            grads += float(d["grad_bytes"][c])
            largest_param = max(largest_param, float(d["param_bytes"][c]))
            largest_out = max(largest_out, float(self.out_bytes(n)[c]))
        for u in assignment:
            for v, e in G.succ[u].items():
                if v in assignment and v != received:
                    cost = e["cost"][assignment[u], assignment[v]]
                    time_s += float(cost[0])
                    total += k * float(cost[1])
                    if u == received:
                        received_saved += k * float(cost[1])
        backward = self.backward_excess_bytes(first, last, assignment) if walk else None
        memory = self._parts(assignment, received, sent, k, total, state, grads, largest_param, largest_out,
                             received_saved, backward)
        return time_s, step_s, total, memory

    def _memory(self, H: nx.DiGraph, assignment: dict[str, int], backward_bytes: float | None = None
                ) -> StageMemory:
        """:func:`tensoropt.pipeline.stage_memory.stage_memory` of an assignment on ``H``: the stage
        graph's memory (state + k x saved activations) split into its parts (``backward_bytes``:
        :meth:`backward_excess_bytes`, where walked)."""
        received, sent, k = H.graph["pipeline_stage"]
        total = state = grads = largest_param = largest_out = received_saved = 0.0
        for n, c in assignment.items():
            d = H.nodes[n]
            total += float(d["cost"][c, 1])
            if n == received or d["kind"] == "input":
                continue
            state += float(sum(d[p][c] for p in STATE_PARTS))
            grads += float(d["grad_bytes"][c])
            largest_param = max(largest_param, float(d["param_bytes"][c]))
            largest_out = max(largest_out, float(self.out_bytes(n)[c]))
        for u, v, e in H.edges(data=True):
            mem = float(e["cost"][assignment[u], assignment[v], 1])
            total += mem
            if u == received:
                received_saved += mem
        return self._parts(assignment, received, sent, k, total, state, grads, largest_param, largest_out,
                           received_saved, backward_bytes)

    def _parts(self, assignment: dict[str, int], received: str | None, sent: str | None, k: int,
               total: float, state: float, grads: float, largest_param: float, largest_out: float,
               received_saved: float, backward_bytes: float | None = None) -> StageMemory:
        """:func:`tensoropt.pipeline.stage_memory.stage_memory` from a stage's sums: its memory
        ``total`` (state + ``k`` x activations), state, gradients, largest parameter and output, the
        saved bytes of the received tensor (``k`` micro-batches of it) and, where walked, its backward
        transient (:meth:`backward_excess_bytes`)."""
        k = max(int(k), 1)
        return stage_memory(
            state, (total - state) / k, k, self.m,
            received_bytes=float(self.boundary_bytes[received][assignment[received]]) if received else 0.0,
            received_saved_bytes=received_saved / k,
            sent_bytes=float(self.boundary_bytes[sent][assignment[sent]]) if sent else 0.0,
            largest_output_bytes=largest_out, grad_bytes=grads, largest_param_bytes=largest_param,
            data_parallel=self.devices, backward_bytes=backward_bytes)


def pipelined_frontier(
    solver: StageSolver, num_stages: int, schedule: str, epsilon: float = 0.0
) -> tuple[list[PipelinedPlan], float]:
    """The exact frontier over partitions and stage options for one (p, m, schedule).

    Returns:
        ``(plans, bound)``: the plans by time, and the DP's bound (0 when exact).
    """
    b, m = solver.blocks, solver.m
    in_flight = in_flight_micro_batches(schedule, num_stages, m)
    if stages_per_rank(schedule) > 1:
        return _interleaved(solver, num_stages, schedule, in_flight, epsilon)
    middle = in_flight[1:-1]
    sizes = stage_sizes(b.count, num_stages)

    def options(s: int, first: int, last: int) -> np.ndarray:
        if (first > 0 and not b.can_cut(first - 1)) or not b.can_cut(last):
            return np.zeros((0, 3))
        others = (min(middle), max(middle)) if 0 < s < num_stages - 1 and middle else ()
        return solver.option_costs(first, last, in_flight[s], others)

    result = pipeline_frontier(b.count, num_stages, m, options, lambda s: sizes, epsilon=epsilon)
    plans = []
    for point in result.points:
        chosen = []
        for s, ((first, last), row) in enumerate(zip(point.blocks, point.options)):
            others = (min(middle), max(middle)) if 0 < s < num_stages - 1 and middle else ()
            chosen.append(solver.option(first, last, in_flight[s], row, others))
        plans.append(PipelinedPlan(point, num_stages, schedule, m, list(b.names), in_flight, chosen))
    return plans, result.bound


def _interleaved(solver: StageSolver, num_ranks: int, schedule: str, in_flight: list[int],
                 epsilon: float) -> tuple[list[PipelinedPlan], float]:
    """:func:`pipelined_frontier` of an interleaved schedule: ``v p`` virtual stages, each solved
    at its own in-flight count, combined per rank
    (:func:`frontier.pipeline_interleaved.interleaved_frontier`)."""
    b, m = solver.blocks, solver.m
    chunks = stages_per_rank(schedule)
    n_virtual = num_ranks * chunks
    if b.count < n_virtual:
        return [], 0.0
    sizes = stage_sizes(b.count, n_virtual)

    def options(s: int, first: int, last: int) -> np.ndarray:
        if (first > 0 and not b.can_cut(first - 1)) or not b.can_cut(last):
            return np.zeros((0, 3))
        return solver.option_costs(first, last, in_flight[s])

    result = interleaved_frontier(b.count, num_ranks, m, options, chunks, lambda s: sizes, epsilon=epsilon)
    plans = []
    for point in result.points:
        chosen = [solver.option(first, last, in_flight[s], row)
                  for s, ((first, last), row) in enumerate(zip(point.blocks, point.options))]
        plans.append(PipelinedPlan(point, num_ranks, schedule, m, list(b.names), in_flight, chosen))
    return plans, result.bound


def label_prefix(num_stages: int) -> str:
    """The prefix of a pipelined plan's ``ops`` labels: its configurations live on the stage mesh.

    Example:
        >>> label_prefix(4) + "batch=2"
        'pp4:batch=2'
    """
    return f"pp{num_stages}:"


def to_plan(pp: PipelinedPlan, solver: StageSolver, devices: int, global_batch_size: int):
    """A pipelined point as a :class:`tensoropt.plans.Plan` (id left to the caller) and its
    configurations (node -> prefixed label -> Configuration JSON) for the frontier's table."""
    from tensoropt.plans import Plan
    from tensoropt.summary import plan_layers, plan_summary

    G, prefix = solver.G, label_prefix(pp.stages)
    assignment: dict[str, int] = {}
    stage_of: dict[str, int] = {}
    for s, ((first, last), option) in enumerate(zip(pp.point.blocks, pp.options)):
        own = set().union(*solver.blocks.nodes[first : last + 1])
        for n, c in option.assignment.items():
            if n in own or (G.nodes[n]["kind"] == "input" and n not in assignment):
                assignment[n] = c
                stage_of[n] = s
    ops = {n: G.nodes[n]["configs"][c] for n, c in assignment.items()}
    configurations = {n: {prefix + ops[n]: solver.configuration_json(n, c)} for n, c in assignment.items()}
    layers, redistributions = plan_layers(G, solver.graph, assignment)
    redistributions = [r for r in redistributions if stage_of.get(r.src) == stage_of.get(r.dst)]
    mesh = G.graph["mesh"]
    per = devices // pp.stages
    stages = "; ".join(f"{pp.block_names[a]}..{pp.block_names[b]} on {s % pp.stages * per}-"
                       f"{(s % pp.stages + 1) * per - 1}, {o.memory_bytes / 2**30:.1f} GiB"
                       for s, ((a, b), o) in enumerate(zip(pp.point.blocks, pp.options)))
    summary = (f"pipeline {pp.stages} x {mesh.num_devices} ({pp.schedule}, {pp.micro_batches} micro-batches, "
               f"bubble {100 * pp.bubble:.0f} %; {stages}) | {plan_summary(solver.graph, ops)}")
    stage_rows = pp.stages_json(devices)
    for row, ((first, last), option), k in zip(stage_rows, zip(pp.point.blocks, pp.options), pp.in_flight):
        row.update(solver.memory(first, last, k, option.assignment).to_json())
    rank_peaks = rank_peak_bytes(stage_rows, pp.stages)
    detail = {
        "bubble_fraction": pp.bubble,
        "stage_mesh": list(mesh.shape),
        "stage_mesh_levels": list(mesh.levels),
        "block_names": list(pp.block_names),
        "stages": stage_rows,
        "max_stage_time_s": pp.point.max_t,
        "sum_stage_time_s": pp.point.sum_t,
        "step_s": pp.point.max_d,
        "virtual_stages_per_rank": pp.chunks,
        "rank_memory_bytes": pp.rank_memory_bytes(),
        "rank_peak_bytes": rank_peaks,
    }
    plan = Plan(
        id="",
        time_s=pp.point.time_s,
        memory_bytes=float(round(pp.point.memory_bytes)),
        ops={n: prefix + label for n, label in ops.items()},
        summary=summary,
        layers=layers,
        redistributions=redistributions,
        throughput_samples_per_s=global_batch_size / pp.point.time_s if pp.point.time_s > 0 else None,
        pipeline=pp.pipeline_json(),
        micro_batches=pp.micro_batches,
        pipeline_detail=detail,
    )
    # what a memory budget is checked against (Plan.peak_memory_bytes): the largest rank's peak, never
    # below the held memory plus the rows' largest transient (a communication buffer)
    plan.peak_tensor_bytes = float(max(max(rank_peaks), plan.memory_bytes + plan.largest_transient_bytes))
    return plan, configurations


def rank_peak_bytes(stages: list[dict], ranks: int) -> list[float]:
    """Each pipeline rank's tensor peak per device from its (virtual) stages' rows of
    ``pipeline_detail.stages`` (``memory_bytes`` held, ``transient_bytes``): rank ``r`` holds stages
    ``r, r + ranks, ...``; their held bytes summed plus the largest of their transients (one
    backward, gradient sync or optimizer step at a time). One stage per rank: its ``peak_bytes``.

    Example:
        >>> rows = [{"memory_bytes": 10, "transient_bytes": 2}, {"memory_bytes": 8, "transient_bytes": 5},
        ...         {"memory_bytes": 1, "transient_bytes": 1}, {"memory_bytes": 1, "transient_bytes": 0}]
        >>> rank_peak_bytes(rows, 2)  # interleaved: rank 0 holds stages 0 and 2, rank 1 stages 1 and 3
        [13.0, 14.0]
    """
    held, transient = [0.0] * ranks, [0.0] * ranks
    for s, row in enumerate(stages):
        held[s % ranks] += float(row["memory_bytes"])
        transient[s % ranks] = max(transient[s % ranks], float(row["transient_bytes"]))
    return [h + t for h, t in zip(held, transient)]


def stages_text(plan) -> str:
    """The stages of a pipelined :class:`tensoropt.plans.Plan` as lines ("" for another plan):
    schedule, micro-batches, bubble, and per stage its blocks, devices, in-flight micro-batches,
    time per micro-batch, once-per-step time and memory.

    Example:
        >>> from tensoropt.plans import Plan
        >>> detail = {"bubble_fraction": 0.2, "stages": [
        ...     {"stage": 0, "first": "embedding", "last": "layers.0", "devices": [0, 3], "in_flight": 2,
        ...      "time_s": 0.01, "step_s": 0.002, "memory_bytes": 2 ** 30}]}
        >>> plan = Plan("d8-p0", 0.1, 2 ** 30, {}, pipeline={"stages": 2, "schedule": "1F1B",
        ...             "micro_batches": 4, "blocks": [[0, 1], [2, 3]]}, pipeline_detail=detail)
        >>> print(stages_text(plan).splitlines()[0])
        pipeline: 2 stages, 1F1B, 4 micro-batches, bubble 20.0 % of the micro-batch phase
    """
    if not plan.pipeline:
        return ""
    pipe, detail = plan.pipeline, plan.pipeline_detail or {}
    lines = [f"pipeline: {pipe['stages']} stages, {pipe['schedule']}, {pipe['micro_batches']} micro-batches, "
             f"bubble {100 * detail.get('bubble_fraction', 0.0):.1f} % of the micro-batch phase"]
    chunks = len(pipe["blocks"]) // max(1, int(pipe["stages"]))
    if chunks > 1:
        memory = detail.get("rank_memory_bytes") or []
        lines.append(f"  {chunks} virtual stages per rank (rank r holds stages r and r + {pipe['stages']}); "
                     "memory per rank: "
                     + ", ".join(f"{r}: {w / 2**30:.2f} GiB" for r, w in enumerate(memory)))
    lines.append("  stage | blocks | devices | in flight | time per micro-batch | once per step | "
                 "memory per device")
    for s in detail.get("stages", []):
        lines.append(f"  {s['stage']} | {s['first']} .. {s['last']} | {s['devices'][0]}-{s['devices'][1]} | "
                     f"{s['in_flight']} | {1e3 * s['time_s']:.2f} ms | {1e3 * s['step_s']:.2f} ms | "
                     f"{s['memory_bytes'] / 2**30:.2f} GiB")
    return "\n".join(lines)
