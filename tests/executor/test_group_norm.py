"""Group norm split on the batch (PoolFormer's ``nn.GroupNorm``) trains as one process.

torch 2.13's DTensor runs ``native_group_norm_backward`` on local shards with the global ``N``
(it adjusts only the forward's scalars): every batch-split group norm crashed in backward
("Expected dY.numel() == N * C * HxW"). :func:`register_group_norm_backward_rule` gives the backward
the forward's batch rule and local scalars. The plans: the batch split everywhere, and PoolFormer's
matrix plan's mix (channel-split convolutions and mean around batch-split norms, so gradients reach
the norms split on the channels and are redistributed).
"""

from __future__ import annotations

import pytest
import torch
from hand_plans import cfg, plan
from launch_helpers import parity_errors, run_plans, single_process

from tensoropt.config import Job
from tensoropt.executor.job.spec import TrainSpec
from tensoropt.executor.ops.dtensor_rules import _known, register_group_norm_backward_rule

JOB = {"model": {"factory": "norm_models:GroupNormNet", "inputs": {"x": {"shape": [3, 8, 8]}},
                 "targets": {"shape": [], "dtype": "int64", "high": 4}, "loss": "cross_entropy"},
       "training": {"global_batch_size": 4, "optimizer": "momentum", "learning_rate": 0.1},
       "cluster": "cpu-local", "devices": [2]}

S0, S1, R = ["S(0)"], ["S(1)"], ["R"]
NORM1 = [("model.norm1.weight", R), ("model.norm1.bias", R)]


def _plans() -> list[dict]:
    dp = plan("gn-dp", (2,), {
        "x": cfg([], S0), "targets": cfg([], S0),
        "conv2d": cfg([S0], S0, [("model.conv1.weight", R), ("model.conv1.bias", R)]),
        "group_norm": cfg([S0], S0, NORM1), "gelu": cfg([S0], S0),
        "conv2d_1": cfg([S0], S0, [("model.conv2.weight", R), ("model.conv2.bias", R)]),
        "group_norm_1": cfg([S0], S0), "mean": cfg([S0], S0),
        "linear": cfg([S0], S0, [("model.head.weight", R), ("model.head.bias", R)]),
        "cross_entropy_loss": cfg([S0, S0], R, partial=(0,))})
    mixed = plan("gn-mixed", (2,), {
        "x": cfg([], R), "targets": cfg([], R),
        "conv2d": cfg([R], S1, [("model.conv1.weight", S0), ("model.conv1.bias", S0)]),
        "group_norm": cfg([S0], S0, NORM1), "gelu": cfg([S0], S0),
        "conv2d_1": cfg([R], S1, [("model.conv2.weight", S0), ("model.conv2.bias", S0)]),
        "group_norm_1": cfg([S0], S0), "mean": cfg([S1], S1),
        "linear": cfg([S1], R, [("model.head.weight", S1), ("model.head.bias", R)], partial=(0,)),
        "cross_entropy_loss": cfg([R, R], R)})
    return [dp, mixed]


def test_the_backward_rule_is_registered():
    import tensoropt.executor.program.interpreter  # noqa: F401 - registers the rules on import

    assert _known(torch.ops.aten.native_group_norm_backward.default)
    assert register_group_norm_backward_rule() is False  # once is enough


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_batch_split_group_norm_trains_as_one_process(tmp_path):
    spec = TrainSpec.from_job(Job.from_dict(JOB))
    runs = [("gn", spec, p) for p in _plans()]
    rc, _ = run_plans(runs, 2, tmp_path, timeout_s=240)
    reference = single_process(spec)
    errors = [e for _, _, p in runs for e in parity_errors("gn", p["id"], tmp_path, reference)]
    assert not errors, "\n".join(errors)
    assert rc == 0
