"""Batch norms priced in the profiled mode as the executor runs them (docs/results.md, ``cnnprice``).

* A channel-split batch norm is timed at its local channels, its running statistics laid out as its
  weight. Before, the whole running statistics beside half the channels made the op raise and the
  node fell back to the roofline: the ResNet's leanest plan of ``benchmarks/fidelity.py`` had its 7
  batch norms priced 0.49 ms a step against 1.53 ms of their kernels clocked in the replayed step.
  The cost graph times it as the executor runs it
  (:func:`tensoropt.executor.ops.batch_norm.channel_split_batch_norm_alone`).
* A batch-split one with synchronised statistics is timed as the executor's own function on one rank
  without its two all-reduces (:func:`tensoropt.executor.ops.batch_norm.synchronized_batch_norm_alone`:
  the statistics' pass, the float64 packing and combination, the backward's per-channel correction),
  not as the fused kernel plus six operators' host overhead (46 us).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time

import torch
from est_plans import CNN, cnn_inputs, cnn_plans

import estimators.profiled as profiled
from estimators.batch_norm import CHANNEL_SPLIT_BATCH_NORM
from estimators.compute import roofline_time_s
from estimators.op_costs import GraphInfo, local_op
from estimators.profiled import ProfiledCompute
from estimators.profiles import load_device
from tensoropt.capture import capture
from tensoropt.configspace.configuration import Mesh
from tensoropt.cost_graph import cost_graph
from tensoropt.executor.ops.batch_norm import channel_split_batch_norm_alone, synchronized_batch_norm_alone

MESH = Mesh((2,), ("gpu",))


def _graph():
    torch.manual_seed(0)
    return capture(CNN(channels=64, size=16), cnn_inputs(size=16))


def _native(x, w, b, rm, rv):
    return torch.ops.aten.batch_norm.default(x, w, b, rm, rv, True, 0.1, 1e-5, False)


def _measured_s(fn, shape: tuple[int, ...], reps: int = 40) -> float:
    """Median seconds of ``fn(x, weight, bias, running_mean, running_var)`` forward + backward on this
    thread's CPU clock (one thread, as a worker runs)."""
    channels = shape[1]
    x = torch.randn(shape, requires_grad=True)
    w, b = torch.randn(channels, requires_grad=True), torch.randn(channels, requires_grad=True)
    rm, rv = torch.zeros(channels), torch.ones(channels)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        times = []
        for _ in range(reps + 2):
            t0 = time.thread_time()
            y = fn(x, w, b, rm, rv)
            y.backward(torch.ones_like(y))
            times.append(time.thread_time() - t0)
            x.grad = w.grad = b.grad = None
    finally:
        torch.set_num_threads(threads)
    return statistics.median(times[2:])


def test_a_channel_split_batch_norm_is_timed_at_its_local_channels(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # a worker's one thread
    g = _graph()
    node = g.nx.nodes["batch_norm"]
    config = cnn_plans(g.nx)["conv-out+fc-row"]["batch_norm"]
    op = local_op(node, config, MESH, GraphInfo.of(g.nx))
    assert op.in_shapes[0] == (8, 32, 16, 16) and op.param_shapes == ((32,), (32,))
    timer = ProfiledCompute(load_device("cpu"), g.program, cache_dir=tmp_path, repeats=10)
    timed = timer("batch_norm", node, config, op)
    assert timed is not None and timer.fallbacks == 0, "the channel split fell back to the roofline"
    measured = _measured_s(_native, op.in_shapes[0])
    # the profile's mean (fresh tensors each repetition) against this median: within a factor 2 at load
    assert 0.5 < sum(timed) / measured < 2.0, (timed, measured)
    roofline = sum(roofline_time_s(load_device("cpu"), op))  # its price before
    assert roofline < 0.5 * measured, (roofline, measured)
    # the cost graph times it as the executor runs it: the kernel without running statistics, their
    # update apart (new tensors, stacked, copied back; the all-gather is communication)
    plan = {k: [v] for k, v in cnn_plans(g.nx)["conv-out+fc-row"].items()}
    cost_graph(g, "cpu-local", 2, compute_mode="profiled", cache_dir=tmp_path, configurations=plan)
    key = profiled.cache_key("cpu", node, dataclasses.replace(op, variant=CHANNEL_SPLIT_BATCH_NORM), 1,
                             "thread")
    executor_path = sum(json.loads(timer.path.read_text())[key])
    measured_path = _measured_s(channel_split_batch_norm_alone, op.in_shapes[0])
    assert measured_path > measured  # the update apart costs more than the fused kernel's
    assert 0.5 < executor_path / measured_path < 2.0, (executor_path, measured_path)


def test_a_synchronised_batch_norm_is_priced_as_the_executor_runs_it(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    g = _graph()
    plan = {k: [v] for k, v in cnn_plans(g.nx)["dp"].items()}
    priced = {mode: float(cost_graph(g, "cpu-local", 2, compute_mode="profiled", cache_dir=tmp_path,
                                     configurations=plan, batch_norm_stats=mode)
                          .nodes["batch_norm"]["compute_s"][0])
              for mode in ("synchronized", "local")}
    shape = (4, 64, 16, 16)  # this rank's rows
    native = _measured_s(_native, shape)
    synced = _measured_s(synchronized_batch_norm_alone, shape)
    # what the executor's synchronised batch norm costs over the fused kernel: 2.2x on an idle machine
    assert synced > 1.3 * native, (synced, native)
    # the profile times beside a co-running rank's thread (1.6-2x this thread alone on an idle 2-core
    # machine, less under load), so prices and this measurement are set against each other as ratios to
    # the fused kernel timed the same way: priced 2.65x, measured 2.15x in the fresh-clone CI of
    # 2026-11-29 (the absolute extra there: 0.53 ms priced, 0.23 ms measured); the old price, the fused
    # kernel plus six operators' host overhead (46 us), gives 1.14x and fails
    ratio = (priced["synchronized"] / priced["local"]) / (synced / native)
    assert 0.67 < ratio < 1.5, (priced, synced, native)
