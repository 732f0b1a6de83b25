"""Block checkpointing's prices in the cost graph (issue 26): the tiny HF Llama job.

Against a hand derivation: on one device in fp32 with every operator replicated, a layer under
``block_recompute`` keeps exactly its input (batch x seq x width float32 numbers, charged once, on
the edge into its first consumer) and nothing else; its time grows by its operators' forward; its
transient is what the same layer saves without the option. Every frontier plan of two devices
gives each block's operators one block option or none (an edge inside a block between two
choices that disagree is infeasible), and the options reach leaner plans than without them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import frontier
from estimators.block_options import BlockError, block_option, find_blocks
from estimators.breakdown import plan_breakdown
from estimators.profiles import load_cluster
from tensoropt.config import load_job
from tensoropt.planner import capture_job, job_cost_graph

pytest.importorskip("transformers", reason="the HuggingFace job needs the dev extra (transformers 5.x)")

JOB = Path(__file__).resolve().parents[2] / "configs" / "jobs" / "hf-llama.yaml"


def _cost_graph(devices: int, options: list[str]):
    job = load_job(JOB)
    job = dataclasses.replace(job, devices=[devices],
                              training=dataclasses.replace(job.training, memory_options=options))
    return job_cost_graph(capture_job(job), job, load_cluster("cpu-local"), devices)


def _per_block(cg, option: str) -> tuple[dict, dict, dict]:
    blocks = cg.graph["blocks"]
    inside = {n: b for b, nodes in blocks.items() for n in nodes}
    assignment = {n: cg.nodes[n]["configs"].index("replicate" + (option if n in inside else "")) for n in cg}
    b = plan_breakdown(cg, assignment)
    kept = {name: 0.0 for name in blocks}
    for row in b["layers"]:
        if row["node"] in inside:
            kept[inside[row["node"]]] += row["activation_bytes"]
    for e in b["redistributions"]:
        if e["dst"] in inside:
            kept[inside[e["dst"]]] += e["memory_bytes"]
    return kept, b, assignment


def test_a_fully_checkpointed_layer_keeps_its_input_only():
    cg = _cost_graph(1, ["block_recompute"])
    assert list(cg.graph["blocks"]) == ["model.model.layers.0", "model.model.layers.1"]
    plain, b_plain, _ = _per_block(cg, "")
    full, b_full, _ = _per_block(cg, ",block_recompute")
    batch, seq, width = 8, 32, 64
    # layer 1's input is layer 0's output (kept by the checkpoint); layer 0's is the embedding's
    # output, which the embedding already charges at its node (several consumers save it)
    assert full["model.model.layers.1"] == batch * seq * width * 4
    assert full["model.model.layers.0"] == 0
    assert all(plain[k] > 10 * batch * seq * width * 4 for k in plain)
    forward_s = b_full["time_s"] - b_plain["time_s"]
    assert forward_s > 0
    # the transient: one layer's activations as the plain plan saves them (its input excluded)
    assert b_full["recompute_transient_bytes"] == pytest.approx(plain["model.model.layers.0"])
    assert b_full["peak_memory_bytes"] < b_plain["peak_memory_bytes"]


def test_disagreeing_choices_inside_a_block_are_infeasible():
    cg = _cost_graph(1, ["block_recompute"])
    inner = [(u, v) for u, v in cg.edges
             if cg.nodes[u]["block"] and cg.nodes[u]["block"] == cg.nodes[v]["block"]]
    assert inner
    for u, v in inner:
        cost = cg.edges[u, v]["cost"]
        for i, cu in enumerate(cg.nodes[u]["configurations"]):
            for j, cv in enumerate(cg.nodes[v]["configurations"]):
                assert np.isinf(cost[i, j]).all() == (block_option(cu) != block_option(cv)), (u, v, i, j)


def test_frontier_plans_checkpoint_whole_blocks_and_reach_leaner_plans():
    cg = _cost_graph(2, ["zero3", "block_recompute", "block_selective"])
    points = frontier.solve(cg)
    options_seen = set()
    for p in points:
        for block, nodes in cg.graph["blocks"].items():
            chosen = {block_option(cg.nodes[n]["configurations"][p.assignment[n]]) for n in nodes}
            assert len(chosen) == 1, (block, chosen)
            options_seen |= chosen
    assert options_seen == {None, "block_recompute", "block_selective"}
    without = frontier.solve(_cost_graph(2, ["zero3"]))
    assert points[-1].cost[1] < without[-1].cost[1]


def test_named_modules_and_their_errors():
    modules = {"a": "m.layers.0.attn", "b": "m.layers.1.attn", "c": "m.head"}
    assert find_blocks(modules) == {"m.layers.0": ["a"], "m.layers.1": ["b"]}
    assert find_blocks(modules, ["m.layers"]) == {"m.layers.0": ["a"], "m.layers.1": ["b"]}
    assert find_blocks(modules, ["m.head"]) == {"m.head": ["c"]}
    with pytest.raises(BlockError, match=r"training\.checkpoint_modules: the model has no module 'm\.nope'"):
        find_blocks(modules, ["m.nope"])
