"""The collectives a plan's price holds (``estimators/priced_collectives.py``), and the rule that a
gradient only the producer's own parameters read is no sync point (``op_costs._leaf``).

The replayed program either sums such a gradient in the gradient all-reduce (a partial sum: a
replicated position embedding read by a batch-split add) or waits for its redistribution only where
the embedding's weight gradient is made, at the end of backward (``benchmarks/collective_match.py``
on GPT-2's and BERT's data-parallel plans, 2026-11-29). The 2-process check of the priced count
against the program's is ``tests/executor/test_collective_count.py``.
"""

from __future__ import annotations

import dataclasses

import networkx as nx
import pytest

from estimators.configuration import Configuration, Mesh
from estimators.op_costs import CostModel, GraphInfo, edge_cost_table
from estimators.priced_collectives import blocking_count, priced_collectives
from estimators.profiles import load_cluster

MESH = Mesh((2,), ("gpu",))
SYNC_S = 2e-3
CLUSTER = load_cluster("cpu-local")
CLUSTER = dataclasses.replace(CLUSTER, device=dataclasses.replace(CLUSTER.device, sync_point_s=SYNC_S))


def _graph(leaf: bool) -> nx.DiGraph:
    """ids -> pos (an embedding: parameters; ``leaf`` False: it also reads x, which needs a gradient)
    -> add (x + pos, batch-split) -> a linear."""
    g = nx.DiGraph()
    f32 = "float32"
    g.add_node("ids", op="input", kind="input", inputs=[], params={}, out_shape=(8,), out_dtype="int64")
    g.add_node("x", op="aten.linear.default", kind="linear", flops=8 * 16 * 16 * 2, out_shape=(8, 16),
               out_dtype=f32, params={"w0": (16, 16)}, inputs=[])
    pos_inputs = [{"source": "ids", "shape": (8,), "dtype": "int64"}]
    if not leaf:
        pos_inputs.append({"source": "x", "shape": (8, 16), "dtype": f32})
    g.add_node("pos", op="aten.embedding.default", kind="embedding", flops=0, out_shape=(8, 16),
               out_dtype=f32, params={"pos.weight": (8, 16)}, inputs=pos_inputs)
    g.add_node("add", op="aten.add.Tensor", kind="elementwise", flops=128, out_shape=(8, 16), out_dtype=f32,
               params={}, inputs=[{"source": "x", "shape": (8, 16), "dtype": f32},
                                  {"source": "pos", "shape": (8, 16), "dtype": f32}])
    g.add_edges_from([("ids", "pos"), ("x", "add"), ("pos", "add")] + ([] if leaf else [("x", "pos")]))
    return g


def _plan(leaf: bool) -> dict[str, Configuration]:
    rep, s0 = ("R",), ("S(0)",)
    batch = (("batch", (0,)),)
    return {"ids": Configuration("replicate", (), (), (), rep),
            "x": Configuration("replicate", (), (), (("w0", rep),), rep),
            "pos": Configuration("replicate", (), (rep,) if leaf else (rep, rep), (("pos.weight", rep),),
                                 rep),
            "add": Configuration("batch=2", batch, (s0, rep), (), s0)}


@pytest.mark.parametrize("leaf", [True, False])
def test_only_a_gradient_the_producer_reads_itself_is_priced_without_a_sync_point(leaf):
    g, plan = _graph(leaf), _plan(leaf)
    rows = [r for r in priced_collectives(g, CLUSTER, MESH, plan)
            if r["edge"] == "pos" and r["owner"] == "add"]
    # the batch-split add returns a partial gradient for the replicated position embedding: one all-reduce
    assert [(r["kind"], r["bytes"]) for r in rows] == [("all_reduce", 8 * 16 * 4)]
    assert blocking_count(rows) == (0 if leaf else 1)
    model = CostModel(CLUSTER, MESH, "adamw")
    info = GraphInfo.of(g)
    table = edge_cost_table(model, info, g, "pos", "add", [plan["pos"]], [plan["add"]])
    fit = model.comm.time_s("all_reduce", 8 * 16 * 4, (0,))
    extra = float(table["comm_s"][0, 0]) - fit  # beyond the collective's fit: copies, dispatch, sync point
    assert (extra < SYNC_S) == leaf, (extra, fit)
