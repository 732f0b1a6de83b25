"""Stage frontiers of a model of identical blocks from one transfer table and one sweep (issue 27).

A stage holding blocks ``[f, l]`` is a chain (:mod:`frontier.chain`): its start (the received
tensor's layout and receive, or the embedding), its blocks, its end (the send of its last block's
output, or the head). With identical blocks every middle block has the same *transfer table*: the
block's interior eliminated once, per (configuration of the tensor it receives, configuration of the
one it produces) (:func:`frontier.chain.eliminate_except`). The first numbered block has its own (it
receives the embedding's output). A sweep from each kind of start -- the embedding, the embedding's
output received, a block's output received -- adds one block per step, so one sweep of ``N`` steps
gives the frontier of every stage length up to ``N`` (:func:`frontier.chain.sweep_step`); a stage's
frontier is its sweep's table at its length with its end added (:func:`frontier.chain.finish`).

What a stage's frontier depends on is (blocks held, holds the embedding, holds the head, receives the
embedding's output, in-flight count ``k``). The memory at ``k`` is ``state + k x activations``, so with
``ChainSettings.in_flight = (k1, k2)`` the transfer tables and sweeps are kept in three objectives,
(time, memory at ``k1``, memory at ``k2``) (:func:`tensoropt.pipeline.in_flight_memory.split_memory`),
and a stage's frontier at any ``k`` of the range is that frontier projected to (time, memory at ``k``)
and pruned (:func:`project`). Exact: the memory at ``k`` is a convex combination of the two ends
(:func:`tensoropt.pipeline.in_flight_memory.memory_at`), so a point beaten at both ends is beaten at
``k``, and sums of tables stay linear in ``k``. Every stage count, partition and in-flight count of
one stage mesh reads the same tables (without a range: a set of two-objective tables per ``k``).
Exact with ``step_epsilon = 0``; otherwise the sweep steps
(and block eliminations past ``box_min_candidates``) are boxed on the planner's grid and the bound
``(1 + e)^depth - 1`` is tracked per table (:attr:`StageChain.bound`, printed with the plan).
Applies when the blocks are identical, every boundary between blocks is a cut (one tensor crosses),
no middle block reads a graph input or a tied weight (:meth:`StageChain.applies`); otherwise
:class:`tensoropt.pipeline.search.StageSolver` solves each stage graph by the FT solve.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from frontier.chain import bound_of, eliminate_except, finish, start_table, sweep_step
from frontier.cover import cover_to_count
from frontier.pareto import pareto_select
from tensoropt.pipeline.in_flight_memory import memory_at


@dataclass
class ChainSettings:
    """How :class:`StageChain` solves: the box factor, which eliminations it boxes, the plans kept.

    Example:
        >>> ChainSettings(step_epsilon=0.0005, max_plans=12).max_plans
        12
    """

    step_epsilon: float = 0.0
    """Box factor of each sweep step and of boxed block eliminations (0: exact)."""
    box_min_candidates: float = 0.0
    """Box only the eliminations generating more candidate points than this."""
    max_plans: int | None = None
    """Plans kept per stage frontier (a proven cover, :func:`frontier.cover.cover_to_count`); None: all."""
    in_flight: tuple[int, int] | None = None
    """``(k1, k2)``: one set of tables in (time, memory at k1, memory at k2) serves every in-flight
    count of the range (:meth:`StageChain.tables_for`); None, or a count outside: a set per count."""


class StageChain:
    """Stage frontiers of a :class:`tensoropt.pipeline.search.StageSolver` built from transfer tables.

    Args:
        solver: the stage solver (its cost graph, blocks, stage graphs and canonical orders).
        settings: the :class:`ChainSettings`.
    """

    def __init__(self, solver, settings: ChainSettings):
        self.solver, self.settings = solver, settings
        self.memo: dict = {}
        self.sweeps: dict[str, list] = {}
        self.parts: dict[str, object] = {}
        self.finished: dict[tuple, object] = {}
        """Stage frontier tables in three objectives by (sweep start, blocks swept, holds the head)."""
        self._interiors: dict[tuple, dict] = {}
        self._renames: dict[tuple[int, int], dict] = {}
        self.bound = 0.0
        """The largest bound of a stage frontier returned (boxing and thinning together)."""
        self.eliminations = 0
        """Block eliminations computed (transfer tables, embedding and head frontiers)."""
        self.steps = 0
        """Sweep steps computed."""
        self.cpu_s = {"eliminations": 0.0, "sweeps": 0.0, "finish": 0.0}
        """This process's CPU seconds in block eliminations, sweep steps and stage ends (with plans)."""

    @staticmethod
    def applies(solver) -> bool:
        """Whether every stage of ``solver``'s model is such a chain (see the module docstring).

        Example:
            >>> # tests/planner/test_pipeline_chain.py: the zoo GPT and HF Llama qualify
            >>> True
            True
        """
        b, G = solver.blocks, solver.G
        if not b.identical or not all(b.cuts) or b.count < 4:
            return False
        for j in range(1, b.count - 1):
            if any(G.nodes[u]["kind"] == "input" for n in b.nodes[j] for u in G.predecessors(n)):
                return False
        ends = b.nodes[0] | b.nodes[-1]  # a tied weight read in a middle block: blocks differ in cost
        return all(u in ends and v in ends for u, v, _ in getattr(solver, "tie_pairs", ()))

    def _kw(self) -> dict:
        return {"step_epsilon": self.settings.step_epsilon,
                "box_min_candidates": self.settings.box_min_candidates, "memo": self.memo}

    def tables_for(self, k: int):
        """The key of the tables serving ``k`` in flight: the range ``settings.in_flight`` when it
        holds ``k`` (three objectives), else ``k`` itself (two).

        Example:
            >>> chain = StageChain.__new__(StageChain)
            >>> chain.settings = ChainSettings(in_flight=(1, 8))
            >>> chain.tables_for(3), chain.tables_for(16)
            ((1, 8), 16)
        """
        low_high = self.settings.in_flight
        if low_high is not None and low_high[0] <= k <= low_high[1] and low_high[0] < low_high[1]:
            return tuple(low_high)
        return k

    def _graph(self, j: int, key):
        """Block ``j``'s stage graph for the tables ``key`` (:meth:`tables_for`) without the
        receive's and the send's costs (the chain adds them)."""
        s = self.solver
        b = s.blocks
        H = s._stage_graph(j, j, key)
        if j > 0:
            H.nodes[b.boundary[b.names[j - 1]]]["cost"][:] = 0.0
        if j < b.count - 1:
            sent = b.boundary[b.names[j]]
            H.nodes[sent]["cost"][:, 0] -= s.p2p_s[sent]
        return H

    def _part(self, kind: str, tables_key):
        """The embedding's frontier per its output (``emb``), the head's per its input (``head``),
        the first block's (``first``) and any later block's (``block``) transfer table, for the
        tables ``tables_key`` (:meth:`tables_for`)."""
        key = (kind, tables_key)
        if key not in self.parts:
            b = self.solver.blocks
            j = {"emb": 0, "first": 1, "block": 2, "head": b.count - 1}[kind]
            keep = ([b.boundary[b.names[j - 1]]] if j > 0 else []) + (
                [b.boundary[b.names[j]]] if j < b.count - 1 else [])
            start = time.process_time()
            reduced = eliminate_except(self._graph(j, tables_key), keep, **self._kw())
            self.cpu_s["eliminations"] += time.process_time() - start
            self.eliminations += 1
            self.parts[key] = (reduced, reduced.relabelled(), j)
        return self.parts[key]

    def _sweep(self, start: str, tables_key, n: int) -> list:
        """The sweep's tables ``V_0 .. V_n`` from ``start`` (``emb``, ``after_emb``, ``recv``)."""
        s, b = self.solver, self.solver.blocks
        key = (start, tables_key)
        if key not in self.sweeps:
            if start == "emb":
                V0 = self._part("emb", tables_key)[1]
            else:
                received = b.boundary[b.names[0 if start == "after_emb" else 1]]
                V0 = start_table(_time_only(s.p2p_s[received], tables_key))
            self.sweeps[key] = [V0]
        tables = self.sweeps[key]
        while len(tables) <= n:
            first_block = start != "recv" and len(tables) == 1
            R = self._part("first" if first_block else "block", tables_key)[1]
            start = time.process_time()
            tables.append(sweep_step(tables[-1], R, **self._kw()))
            self.cpu_s["sweeps"] += time.process_time() - start
            self.steps += 1
        return tables

    def vectors(self, first: int, last: int, k: int) -> list[tuple[int, ...]]:
        """The stage ``[first, last]``'s frontier at ``k`` in flight, as configuration vectors over
        the solver's canonical order (:meth:`tensoropt.pipeline.search.StageSolver.canonical`).

        The stage's frontier in (time, state, activations) (:meth:`frontier3`) projected to (time,
        state + ``k`` x activations) and pruned (:func:`project`): exact, since a point dominated in
        three objectives is dominated in the projection for every ``k >= 0``."""
        key = self.tables_for(k)
        F, V, tables, n = self.frontier3(first, last, key)
        begin = time.process_time()
        if not F.size:
            return []
        rows, thin = project(F.cost, key, k), 0.0
        if self.settings.max_plans is not None:
            kept, thin = cover_to_count(_at(F.cost[rows], key, k), self.settings.max_plans)
            rows = rows[kept]
        self.bound = max(self.bound, (1.0 + thin) * (1.0 + bound_of(F, self.settings.step_epsilon)) - 1.0)
        names = self.solver.canonical(first, last)
        out = []
        for r in np.asarray(rows, dtype=np.int64):
            assignment = self._walk(F, V, int(r), tables, first, last, n, key)
            out.append(tuple(assignment[name] for name in names))
        self.cpu_s["finish"] += time.process_time() - begin
        return out

    def frontier3(self, first: int, last: int, tables_key):
        """The stage ``[first, last]``'s frontier table from the tables ``tables_key`` (three
        objectives for a range of in-flight counts, :meth:`tables_for`), with the sweep table it
        ends, the sweep and the sweep's length behind it: ``(F, V, tables, n)``."""
        s, b = self.solver, self.solver.blocks
        L = b.count
        if first == 0 and last == L - 1:
            raise ValueError("a stage holding the whole model is no chain")
        start = "emb" if first == 0 else ("after_emb" if first == 1 else "recv")
        chain_last = min(last, L - 2)
        n = chain_last if first == 0 else max(0, chain_last - first + 1)
        tables = self._sweep(start, tables_key, n)
        key = (start, n, last == L - 1, tables_key)
        if key not in self.finished:
            begin = time.process_time()
            V = tables[n]
            if last == L - 1:
                E = self._part("head", tables_key)[1]
            else:
                E = start_table(_time_only(s.p2p_s[b.boundary[b.names[last]]], tables_key))
            self.finished[key] = finish(V, E, **self._kw())
            self.cpu_s["finish"] += time.process_time() - begin
        return self.finished[key], tables[n], tables, n

    def _walk(self, F, V, r: int, tables: list, first: int, last: int, n: int, key) -> dict:
        """The configuration of every node of the stage behind row ``r`` of its frontier ``F``."""
        b = self.solver.blocks
        L = b.count
        out: dict[str, int] = {}
        iv = next(i for i, c in enumerate(F.children) if c is V)
        ie = 1 - iv
        # the last boundary variable of the chain: the block before the end's output
        boundary_block = (first - 1 + n) if first > 0 else n
        out[b.boundary[b.names[boundary_block]]] = int(F.vals[r])
        if last == L - 1:
            out.update(self._interior("head", key, int(F.rows[r, ie])))
        row = int(F.rows[r, iv])
        for i in range(n, 0, -1):
            Vi = tables[i]
            j = boundary_block - (n - i)  # the block this step added
            iv_prev = next(t for t, c in enumerate(Vi.children) if c is tables[i - 1])
            ir = 1 - iv_prev
            out[b.boundary[b.names[j - 1]]] = int(Vi.vals[row])
            out.update(self._interior("first" if j == 1 else "block", key, int(Vi.rows[row, ir]), j))
            row = int(Vi.rows[row, iv_prev])
        if first == 0:
            out.update(self._interior("emb", key, row))
        return out

    def _interior(self, kind: str, key, row: int, j: int | None = None) -> dict:
        """The configurations behind ``row`` of the part ``kind``'s table (:meth:`_part`), as block
        ``j``'s nodes for a transfer table; computed once per (part, row, block) and shared (read only:
        the stage frontiers of every length and in-flight count walk the same rows)."""
        cache_key = (kind, key, row, j)
        if cache_key not in self._interiors:
            reduced, _, rep = self._part(kind, key)
            interior = reduced.assignments([row])[0]
            self._interiors[cache_key] = interior if j is None else self._rename(interior, rep, j)
        return self._interiors[cache_key]

    def _rename(self, interior: dict, rep: int, j: int) -> dict:
        """Block ``rep``'s node names of ``interior`` as block ``j``'s (identical blocks, same order)."""
        if rep == j:
            return interior
        if (rep, j) not in self._renames:
            s = self.solver
            self._renames[rep, j] = dict(zip(s.canonical(rep, rep), s.canonical(j, j)))
        mapping = self._renames[rep, j]
        return {mapping[n]: c for n, c in interior.items()}


def _time_only(time_s: np.ndarray, tables_key) -> np.ndarray:
    """Per-configuration costs of a receive or a send: its time, no memory (two or three objectives)."""
    zero = np.zeros_like(time_s)
    return np.stack([time_s, zero] + ([zero] if isinstance(tables_key, tuple) else []), axis=1)


def _at(cost: np.ndarray, tables_key, k: int) -> np.ndarray:
    """(time, memory at ``k``) of rows of a table keyed ``tables_key`` (:meth:`StageChain.tables_for`)."""
    if not isinstance(tables_key, tuple):
        return cost
    return np.stack([cost[:, 0], memory_at(cost[:, 1], cost[:, 2], tables_key, k)], axis=1)


def project(cost: np.ndarray, tables_key, k: int) -> np.ndarray:
    """Rows of a stage frontier on its (time, memory at ``k``) frontier, one per distinct point, by
    time; a table in (time, memory at k1, memory at k2) is projected to ``k`` first.

    Example:
        >>> cost3 = np.array([[1.0, 11.0, 18.0], [2.0, 5.0, 33.0], [3.0, 5.0, 5.0]])
        >>> project(cost3, (1, 8), 1).tolist(), project(cost3, (1, 8), 4).tolist()
        ([0, 1], [0, 2])
    """
    return pareto_select(_at(np.asarray(cost, dtype=np.float64), tables_key, k))
