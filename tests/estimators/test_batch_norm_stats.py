"""The planner prices a batch-split batch norm's synchronised statistics (estimators/batch_norm.py).

On the 2-process gloo profile each statistics all-reduce costs ~1.1 ms: the data-parallel plan of
a CNN with one batch norm is priced two all-reduces (forward, backward) and the per-channel
arithmetic's host overhead dearer with ``training.batch_norm: synchronized`` than with ``local``;
a channel split (each rank owns its channels' statistics) costs the same in both modes: the
all-gather of the updated running statistics into the replicated buffers.
"""

from __future__ import annotations

import pytest
import torch
from est_plans import CNN, cnn_inputs, cnn_plans

from estimators.batch_norm import SYNC_EXTRA_OPERATORS, stats_time_s
from estimators.collectives import CommModel
from estimators.profiles import load_cluster
from tensoropt.capture import capture
from tensoropt.configspace.configuration import Mesh
from tensoropt.cost_graph import cost_graph

MESH = Mesh((2,), ("gpu",))


def _priced(plan: dict, stats: str):
    torch.manual_seed(0)
    g = capture(CNN(), cnn_inputs())
    return cost_graph(g, "cpu-local", 2, configurations={k: [v] for k, v in plan.items()},
                      batch_norm_stats=stats), g


def test_synchronised_statistics_cost_two_all_reduces_on_a_batch_split():
    torch.manual_seed(0)
    plan = cnn_plans(capture(CNN(), cnn_inputs()).nx)["dp"]
    synced, g = _priced(plan, "synchronized")
    local, _ = _priced(plan, "local")
    cluster = load_cluster("cpu-local")
    comm = CommModel(cluster, MESH)
    channels = g.nx.nodes["batch_norm"]["inputs"][0]["shape"][1]
    forward, backward = 2 * channels * 8, 2 * channels * 4  # float64 [sum, sumsq]; float32 [dy, dy*xhat]
    # each a blocking collective: its fit plus the device's wait at a sync point (issue 29)
    expected = (comm.time_s("all_reduce", forward, (0,)) + comm.time_s("all_reduce", backward, (0,))
                + 2 * cluster.device.sync_point_s)
    assert expected > 1e-4  # gloo: a millisecond-scale latency each
    for n in g.nx.nodes:
        extra_comm = synced.nodes[n]["comm_s"][0] - local.nodes[n]["comm_s"][0]
        extra_compute = synced.nodes[n]["compute_s"][0] - local.nodes[n]["compute_s"][0]
        if n == "batch_norm":
            assert extra_comm == pytest.approx(expected)
            assert extra_compute == pytest.approx(SYNC_EXTRA_OPERATORS * cluster.device.op_overhead_dtensor_s)
        else:
            assert extra_comm == 0 and extra_compute == 0, n
    assert stats_time_s(comm, g.nx.nodes["batch_norm"], plan["batch_norm"], backward=True) == \
        pytest.approx(expected)


def test_a_channel_split_needs_no_statistics_collective_only_the_running_statistics_gather():
    torch.manual_seed(0)
    plan = cnn_plans(capture(CNN(), cnn_inputs()).nx)["conv-out+fc-row"]
    synced, g = _priced(plan, "synchronized")
    local, _ = _priced(plan, "local")
    assert synced.nodes["batch_norm"]["cost"][0, 0] == local.nodes["batch_norm"]["cost"][0, 0]
    channels = g.nx.nodes["batch_norm"]["inputs"][0]["shape"][1]
    comm = CommModel(load_cluster("cpu-local"), MESH)
    gather = comm.time_s("all_gather", 2 * channels * 4, (0,))
    # its weight and bias are split by channel: no gradient is synchronised, no bucket latency
    assert synced.nodes["batch_norm"]["comm_s"][0] == pytest.approx(gather)  # [running mean; var]


def test_an_unknown_mode_is_refused():
    torch.manual_seed(0)
    plan = cnn_plans(capture(CNN(), cnn_inputs()).nx)["dp"]
    with pytest.raises(ValueError, match="synchronized"):
        _priced(plan, "sync")
