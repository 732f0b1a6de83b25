"""``training.batch_norm``: synchronised statistics (one all-reduce each way) and DDP's per-rank statistics.

The synchronised batch norm's parity with one process is in test_parity.py and test_zoo_parity.py
(the toy CNN and ResNet-50 plans at 2 and 4 processes). Here, at 2 processes on the toy CNN's
data-parallel plan: ``local`` trains exactly as DistributedDataParallel on the same module and
rows (losses, parameters, rank 0's running statistics), ``synchronized`` adds exactly two
collectives per batch norm (one all-reduce in forward, one in backward) to the replayed program,
and its running statistics equal the one-process model's under a batch and a channel split.
"""

from __future__ import annotations

import json

import pytest
import torch
from launch_helpers import ENV, HERE

from tensoropt.config import ConfigError, Job
from tensoropt.executor.ops.batch_norm import batch_norm
from tensoropt.launch import LaunchOptions, launch_module


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_local_statistics_train_as_ddp_and_synchronised_adds_two_collectives(tmp_path):
    out = tmp_path / "bn.json"
    rc = launch_module(str(HERE / "bn_probe.py"), [str(out)], LaunchOptions(2, timeout_s=240), env=ENV)
    assert rc == 0
    got = json.loads(out.read_text())
    for step, (a, b) in enumerate(zip(got["local"], got["ddp"])):
        assert abs(a - b) <= 1e-5 * abs(b), f"step {step}: local batch norm loss {a}, DDP {b}"
    for key, diff in got["param_diff"].items():
        assert diff <= 1e-5 * got["param_scale"][key], f"{key} differs from DDP's by {diff}"
    assert max(got["buffer_diff"].values()) <= 1e-5, got["buffer_diff"]
    # the comparison can tell the two modes apart: global statistics train another model
    assert max(abs(a - b) / abs(b) for a, b in zip(got["synchronized"][1:], got["ddp"][1:])) > 1e-4, got
    assert got["collectives"]["synchronized"] - got["collectives"]["local"] == 2, got["collectives"]
    # synchronised running statistics (batch split; channel split, replicated buffers gathered
    # back) equal the one-process model's
    for plan, diffs in got["synchronized_buffer_diff"].items():
        assert max(diffs.values()) <= 1e-5, (plan, diffs)
    # bf16-mixed (16-bit activations, float32 statistics and sums) trains the same model within bf16's
    # rounding
    for a, b in zip(got["bf16_mixed"], got["synchronized"]):
        assert abs(a - b) <= 2e-2 * abs(b), (got["bf16_mixed"], got["synchronized"])


def test_the_synchronised_statistics_take_the_native_kernels_one_pass():
    """This rank's per-channel mean and variance come from ``batch_norm_update_stats`` (the fused
    kernel's statistics pass), not ``var_mean`` over dims 0, 2, 3 (~3.5x as long on this CPU at
    4 x 256 x 8 x 8: docs/results.md ``cnnprice``); the output and running statistics stay the
    one-process batch norm's."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from tensoropt.executor.ops.batch_norm import synchronized_batch_norm_alone

    torch.manual_seed(0)
    x, w, b = torch.randn(4, 8, 4, 4) * 3 + 1, torch.randn(8), torch.randn(8)
    gm = make_fx(lambda x: synchronized_batch_norm_alone(x, w, b, None, None, True, 0.1, 1e-5))(x)
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert "aten.batch_norm_update_stats.default" in targets and not any("var_mean" in t for t in targets)
    rm, rv, ref_rm, ref_rv = torch.zeros(8), torch.ones(8), torch.zeros(8), torch.ones(8)
    out = synchronized_batch_norm_alone(x, w, b, rm, rv, True, 0.1, 1e-5)
    ref = torch.nn.functional.batch_norm(x, ref_rm, ref_rv, w, b, True, 0.1, 1e-5)
    assert torch.allclose(out, ref, atol=1e-5) and torch.allclose(rm, ref_rm) and torch.allclose(rv, ref_rv)


def test_plain_tensors_run_the_native_op():
    torch.manual_seed(0)
    x = torch.randn(6, 3, 4, 4)
    rm, rv = torch.zeros(3), torch.ones(3)
    out = batch_norm("bn", x, None, None, rm, rv, True, 0.1, 1e-5)
    ref_rm, ref_rv = torch.zeros(3), torch.ones(3)
    ref = torch.nn.functional.batch_norm(x, ref_rm, ref_rv, None, None, True, 0.1, 1e-5)
    assert torch.allclose(out, ref) and torch.allclose(rm, ref_rm) and torch.allclose(rv, ref_rv)


def test_the_job_option_is_checked_and_reaches_the_spec():
    data = {"model": {"name": "mlp"}, "cluster": "cpu-local", "devices": [2]}
    assert Job.from_dict(data).training.batch_norm == "synchronized"
    with pytest.raises(ConfigError, match="training.batch_norm"):
        Job.from_dict({**data, "training": {"batch_norm": "sync"}})
    from tensoropt.executor.job.spec import TrainSpec

    job = Job.from_dict({**data, "training": {"batch_norm": "local", "global_batch_size": 4}})
    assert TrainSpec.from_job(job).batch_norm == "local"
