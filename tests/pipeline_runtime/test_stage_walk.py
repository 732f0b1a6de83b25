"""A pipeline stage's backward transient walked in backward order against the replayed backward's
measured one (one process, the zoo GPT cut in two stages, :mod:`tensoropt.pipeline.stage_walk`).

Each stage runs as the pipelined runtime runs it (:class:`tensoropt.pipeline_runtime.replay.
ReplayedStage`, traced on a first micro-batch, so ``.grad`` exists as between steps); the second
micro-batch is run under :class:`tensoropt.pipeline_runtime.stage_peak.StepPeak` (from its forward
on, so the saved activations its backward frees are seen freed), and each stage's backward measured
as the most bytes alive at once above what was alive when that backward started (the stage's held
state, its saved activations, the output and the received gradient). The walk must
give it within :data:`TOLERANCE`, and on the stage whose peak is in a block's MLP it must be well
below the largest-output bound the stage model used before (``2 x`` the MLP's hidden activation:
at GELU's backward the same micro-batch's GELU output is already freed).
"""

from __future__ import annotations

import copy

import pytest
import torch

from estimators.profiles import load_cluster
from tensoropt.config import Job
from tensoropt.data_parallel import data_parallel_assignment
from tensoropt.executor.job.spec import TrainSpec
from tensoropt.pipeline.search import StageSolver
from tensoropt.pipeline.stages import find_blocks
from tensoropt.pipeline_runtime.replay import ReplayedStage
from tensoropt.pipeline_runtime.stage_modules import build_stages, load_initial_values
from tensoropt.pipeline_runtime.stage_peak import StepPeak
from tensoropt.planner import capture_job, job_cost_graph, micro_batch_job

TOLERANCE = 0.05
"""Measured backward transient within 5 % of the walked one."""

MICRO_BATCHES = 2
ROWS = 8
"""Rows per micro-batch (global batch 16 in 2)."""

JOB = {"model": {"name": "gpt", "kwargs": {"layers": 2, "width": 128, "heads": 2, "seq_len": 128,
                                           "vocab_size": 256, "dropout": 0.0, "tie_weights": False}},
       "cluster": "cpu-local", "devices": [2],
       "training": {"global_batch_size": ROWS * MICRO_BATCHES, "optimizer": "adamw", "seed": 0}}
"""Embedding, 2 blocks, head: the MLP's hidden activation (8 x 128 x 512 floats, 2 MiB) is every
stage's largest output."""

STAGES = [[0, 1], [2, 3]]
"""Embedding + block 0 (sends block 0's output), block 1 + head (the loss)."""


def _predicted():
    """Per stage: (walked backward transient, twice its largest local output)."""
    job = Job.from_dict(JOB)
    job_m = micro_batch_job(job, MICRO_BATCHES)
    graph = capture_job(job_m)
    G = job_cost_graph(graph, job_m, load_cluster("cpu-local"), 1)
    solver = StageSolver(G, graph, find_blocks(graph), MICRO_BATCHES, solve=lambda H: [])
    assignment = data_parallel_assignment(G)
    out = []
    for first, last in STAGES:
        nodes = [n for n in solver.canonical(first, last) if G.nodes[n]["kind"] != "input"]
        largest = max(float(solver.out_bytes(n)[assignment[n]]) for n in nodes[1 if first else 0:])
        out.append((solver.backward_excess_bytes(first, last, assignment), 2 * largest))
    return out


def _measured():
    """Per stage: the second micro-batch's backward, bytes above what was alive when it started."""
    spec = TrainSpec.from_job(Job.from_dict(JOB))
    pipeline = {"stages": 2, "schedule": "GPipe", "micro_batches": MICRO_BATCHES, "blocks": STAGES}
    stages = build_stages(spec, pipeline, ROWS)
    modules = [ReplayedStage(copy.deepcopy(load_initial_values(stages, s, torch.device("cpu"))),
                             stages.input_names[s], received=s > 0) for s in range(2)]
    names = stages.input_names

    def batch(k):
        regions = [((k * ROWS, ROWS), *((0, n) for n in s.shape)) for s in spec.inputs]
        return dict(zip(spec.input_names, spec.batch_source().local(0, regions)))

    def forward(k):
        inputs = batch(k)
        sent = modules[0](**{n: inputs[n] for n in names[0]})
        received = sent.detach().requires_grad_()
        return sent, received, modules[1](received, **{n: inputs[n] for n in names[1]})

    sent, received, loss = forward(0)  # traces both stages, makes every .grad (zeroed in place after)
    loss.backward()
    torch.autograd.backward(sent, received.grad)
    with StepPeak() as peak:  # from the forward on: what backward frees of it is seen freed
        sent, received, loss = forward(1)
        start = peak.peak_bytes = peak.live_bytes
        loss.backward()
        last = peak.peak_bytes - start
        grad = received.grad  # the gradient stage 0 receives (torch's buffer in the runtime)
        del loss, received
        start = peak.peak_bytes = peak.live_bytes
        torch.autograd.backward(sent, grad)
        first = peak.peak_bytes - start
    assert [m.mode for m in modules] == ["replay", "replay"]
    return [first, last]


@pytest.fixture(scope="module")
def walked_and_measured():
    return list(zip(_predicted(), _measured()))


@pytest.mark.parametrize("stage", [0, 1])
def test_the_walk_gives_the_measured_backward_transient(walked_and_measured, stage):
    (walked, _), measured = walked_and_measured[stage]
    assert abs(measured / walked - 1) <= TOLERANCE, (
        f"stage {stage}: measured {measured / 2**20:.3f} MiB, walked {walked / 2**20:.3f} MiB")


def test_the_largest_output_bound_over_prices_the_mlp_stage(walked_and_measured):
    (walked, bound), measured = walked_and_measured[0]
    assert measured < 0.8 * bound, (measured, bound)  # what the stage model priced before: 2 L
    assert walked < 0.8 * bound
