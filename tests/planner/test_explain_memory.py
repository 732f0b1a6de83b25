"""`tensoropt explain`: the chosen plan's memory per device, layer by layer (issue 18)."""

from __future__ import annotations

import dataclasses
import json
import textwrap

import pytest

from estimators.memory import numel
from estimators.memory_parts import COST_PARTS, MEMORY_PARTS, TRANSIENT_PARTS
from estimators.op_costs import Cost
from tensoropt import cli
from tensoropt.commands.explain import load_plan
from tensoropt.commands.explain_memory import PART_LABELS, LayerMemory, memory_by_layer
from tensoropt.config import load_job
from tensoropt.planner import capture_job
from tensoropt.plans import Layer, unpack_frontier_json

GPT_JOB = textwrap.dedent("""\
    model:
      name: gpt
      kwargs: {layers: 2, width: 32, heads: 2}
      seq_len: 16
      vocab_size: 64
    training: {global_batch_size: 4, optimizer: adamw, memory_options: [recompute, zero3]}
    cluster: cpu-local
    devices: [2]
""")


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    folder = tmp_path_factory.mktemp("explain")
    job = folder / "job.yaml"
    job.write_text(GPT_JOB)
    assert cli.main(["plan", str(job), "--out", str(folder / "out"), "--quiet", "--no-plot"]) == 0
    return job, folder / "out"


def test_every_operator_memory_splits_into_its_parts(planned):
    _, out = planned
    for plan_id in ("d2-p0", None):  # the fastest plan and the selected one
        plan = load_plan(str(out / "frontier.json") if plan_id else str(out / "plan.json"), plan_id).plan
        assert sum(x.memory_bytes for x in plan.layers) == pytest.approx(plan.memory_bytes, rel=1e-9)
        for x in plan.layers:
            parts = x.param_bytes + x.grad_bytes + x.optimizer_bytes + x.activation_bytes
            assert parts == pytest.approx(x.memory_bytes, rel=1e-9, abs=1e-6), x


def test_identical_blocks_get_identical_rows_and_parameters_add_up(planned):
    job, out = planned
    plan_file = load_plan(str(out / "frontier.json"), "d2-p0")
    rows = {m.layer: m for m in memory_by_layer(plan_file.plan.layers)}
    blocks = sorted(name for name in rows if name.split(".")[-1].isdigit())
    assert len(blocks) == 2
    a, b = (rows[name] for name in blocks)
    assert (a.operators, a.memory_bytes, a.activation_bytes) == (
        b.operators, b.memory_bytes, b.activation_bytes)
    # AdamW: the optimizer keeps two parameter-sized tensors of every parameter it steps
    assert sum(m.optimizer_bytes for m in rows.values()) == pytest.approx(
        2 * sum(m.param_bytes for m in rows.values()))
    # on 2 devices no parameter is held more than whole, and every one is held at least halved
    graph = capture_job(load_job(job))
    whole = 4 * sum(n for _, d in graph.nx.nodes(data=True) for k, s in d["params"].items()
                    if k not in (d.get("shared_params") or ()) for n in [numel(s)])
    held = sum(m.param_bytes for m in rows.values())
    assert whole / 2 <= held <= whole


def test_explain_prints_the_layer_table(planned, capsys):
    _, out = planned
    assert cli.main(["explain", str(out / "plan.json")]) == 0
    text = capsys.readouterr().out
    table = text[text.index("memory per device by layer:"):]
    for column in ("parameters", "gradients", "optimizer", "activations", "recompute transient",
                   "largest transient"):
        assert column in table.splitlines()[1]
    assert "blocks.0" in table and "blocks.1" in table and "\ntotal " in table


FILE_KEYS = {
    "frontier.json": {"frontiers", "graph", "job", "selected", "timing_s", "version", "selection"},
    "frontier": {"configurations", "devices", "epsilon_bound", "mesh", "mesh_levels", "plans", "timing_s",
                 "layer_rows", "redistribution_rows", "op_rows", "data_parallel"},
    "plan.json": {"devices", "graph", "id", "job", "layers", "memory_bytes", "mesh", "ops", "placements",
                  "pipeline", "redistributions", "summary", "throughput_samples_per_s", "time_s", "version",
                  "micro_batches", "tokens_per_s_per_device", "mfu", "selection", "peak_tensor_bytes"},
    "plan": {"id", "layers", "memory_bytes", "ops", "pipeline", "redistributions", "summary",
             "throughput_samples_per_s", "time_s", "micro_batches", "tokens_per_s_per_device", "mfu",
             "peak_tensor_bytes"},
    "layer": {"node", "op", "module", "config", "compute_s", "comm_s", "memory_bytes", "param_bytes",
              "grad_bytes", "optimizer_bytes", "activation_bytes", "recompute_bytes", "recompute_chain_bytes",
              "buffer_bytes"},
    "redistribution": {"src", "dst", "from", "to", "time_s", "memory_bytes", "tied_param"},
}
"""The keys of GPT_JOB's files as written at 5d324d5, before one tuple (estimators/memory_parts.py)
drove the memory parts: outside tools read them, so they stay (every layer key occurs in this
frontier: recompute and zero3 plans, gradient buffers). Added since: a redistribution's
``tied_param`` (the tied weight moved between its users, estimators/tied.py); every plan's
``pipeline`` (null, or issue 27's mapping; a pipelined plan adds ``pipeline_detail`` and its
frontier ``pipeline_search``, absent here: one node, no pipeline); every plan's ``micro_batches``
(issue 25) and, for token inputs, ``tokens_per_s_per_device`` and the predicted ``mfu``; version 2
(issue 26): a frontier's ``layer_rows``, ``redistribution_rows`` and ``op_rows``, which its plans'
``layers``, ``redistributions`` and ``ops`` index (the rows' keys are read from the tables); issue 29's
``selection`` (how the selected plan was chosen: rule, margin, gain) in frontier.json and plan.json
and each frontier's ``data_parallel`` plan (every row inline); every plan's ``peak_tensor_bytes`` of one
micro-batch (the step-order tensor peak, :mod:`tensoropt.peak_transients`)."""


def test_plan_files_keep_their_keys(planned):
    _, out = planned
    frontier = json.loads((out / "frontier.json").read_text())
    plan = json.loads((out / "plan.json").read_text())
    plans = [p for f in unpack_frontier_json(frontier)["frontiers"] for p in f["plans"]]
    found = {
        "frontier.json": set(frontier),
        "frontier": {k for f in frontier["frontiers"] for k in f},
        "plan.json": set(plan),
        "plan": {k for p in plans for k in p},
        "layer": {k for p in [*plans, plan] for x in p["layers"] for k in x},
        "redistribution": {k for p in [*plans, plan] for x in p["redistributions"] for k in x},
    }
    assert found == FILE_KEYS


def test_every_memory_part_is_declared_where_it_is_carried():
    assert set(COST_PARTS) <= {f.name for f in dataclasses.fields(Cost)}
    layer = [f.name for f in dataclasses.fields(Layer)]
    assert layer[layer.index("memory_bytes") + 1:] == [*MEMORY_PARTS, *TRANSIENT_PARTS]
    assert set(MEMORY_PARTS) <= {f.name for f in dataclasses.fields(LayerMemory)}
    assert list(PART_LABELS) == list(MEMORY_PARTS)
    parts = {k: float(i + 1) for i, k in enumerate((*MEMORY_PARTS, *TRANSIENT_PARTS))}
    row = Layer("a", "aten.linear.default", "blocks.0.fc", "replicate", 0.0, 0.0, 10.0, **parts)
    assert set(row.to_json()) == FILE_KEYS["layer"] and Layer.from_json(row.to_json()) == row
    m = memory_by_layer([row, row])[0]
    assert m.memory_bytes == 2 * sum(parts[k] for k in MEMORY_PARTS)
