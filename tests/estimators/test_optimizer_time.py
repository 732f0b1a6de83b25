"""The optimizer's priced time against its part of a training step as the user's loop runs it.

The cpu profile prices a step's optimizer part as AdamW's 7 parameter-sized passes at
``optimizer_bandwidth_gbps`` plus ``optimizer_tensor_s`` per parameter tensor
(estimators/compute.py ``optimizer_time_s``). What that stands for is timed here as
``tensoropt run`` runs it (:class:`tensoropt.training.optimizer_clock.OptimizerClock`): the
gradients handed to the parameters (DTensors), ``optimizer.step()`` with tensoropt's hooks and
``zero_grad``, on the main thread's CPU clock, in replayed data-parallel steps of 2 gloo processes
of one thread, as the profile was fit (``benchmarks/optimizer_step.py``; in one process, without the
collectives' waits between a step's parts, 64 small tensors took 1.1 ms where 2 ranks take ~1.7).
Before (fit on ``step_local`` alone: 43.4 GB/s and 10 us a tensor) the many-small case was priced
0.98 ms against 2.33 ms timed here (-58 %, outside the tolerance), the few-large one 2.79 against 3.27
(-15 %); now 2.42 (+4 %) and 3.52 (+8 %), at load 8-10. The profile has no per-step term (~0.7 ms,
docs/results.md optfit): spread over the tensors, it leaves a model of few small tensors (8, of 1 Mi
parameters in all) priced ~27 % under.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from estimators.compute import fit_optimizer_time, optimizer_time_s
from estimators.profiles import load_device

pytestmark = pytest.mark.timeout(300)

TOLERANCE = 0.5
"""Priced within 50 % of the timed part (median of 15 clocked steps). The profile was fit at load 8-10
(configs/devices/cpu.yaml, within 25 % of every point it was fit on); on a quieter machine the
many-small part times less (1.96 ms at load 2.4, ~1.7 ms idle, priced 2.42 ms: +24 to +42 %), and a
fresh-clone CI failed the earlier 35 %. The constants before the refit (-58 %) still fail."""

CASES = {"few-large": (1024, 4), "many-small": (128, 32)}
"""name -> (width, linear layers) of the zoo MLP: 8 tensors of 4 Mi parameters in all (the bytes weigh
most) and 64 tensors of 0.5 Mi in all (the per-tensor time weighs most)."""


def _trainer(width: int, layers: int):
    """A replaying Trainer of the zoo MLP (AdamW), data parallel over the 2 ranks."""
    from tensoropt.baselines import data_parallel_index
    from tensoropt.capture import capture
    from tensoropt.configspace import configurations
    from tensoropt.configspace.configuration import Mesh
    from tensoropt.executor.job.data import InputSpec, synthetic_batch
    from tensoropt.executor.job.plan import ExecPlan
    from tensoropt.executor.job.spec import TrainSpec
    from tensoropt.training.trainer import Trainer

    spec = TrainSpec("tensoropt.models.mlp:MLP", (InputSpec((width,)), InputSpec((), "int64", high=width)), 8,
                     {"in_features": width, "hidden": [width] * (layers - 1), "num_classes": width},
                     optimizer="adamw", lr=1e-3, steps=1)
    graph = capture(spec.build_model(), synthetic_batch(list(spec.inputs), 8, spec.seed, 0))
    mesh = Mesh((2,), ("gpu",))
    placements = {n: confs[data_parallel_index(confs, mesh)].to_json()
                  for n, confs in configurations(graph, mesh).items()}
    plan = {"id": "dp", "devices": 2, "mesh": {"shape": [2], "levels": ["gpu"]}, "placements": placements}
    return Trainer(spec, ExecPlan.from_json(plan), mode="replay")


def _timed_s(trainer, steps: int = 15) -> float:
    """Median thread-CPU seconds of the optimizer's part of ``steps`` replayed steps."""
    from tensoropt.training.optimizer_clock import OptimizerClock

    trainer.train(2)  # the first step is interpreted (measured), the second traces the program
    with OptimizerClock(trainer) as clock:
        for i in range(steps):
            trainer.step(10 + i, measure_memory=False)
    if len(clock.steps) != steps:
        raise RuntimeError(f"{len(clock.steps)} of {steps} steps replayed without tracing")
    return clock.median("optimizer_s")


def _worker(rank: int, store_path: str, out_path: str) -> None:
    """One of 2 ranks: each case's optimizer part timed; rank 0 writes (seconds, bytes, tensors)."""
    import torch.distributed as dist

    from tensoropt.executor.state.local_optim import _local
    from tensoropt.executor.state.worker import end_process_group

    torch.set_num_threads(1)  # a torchrun worker's one thread
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    try:
        got = {}
        for name, (width, layers) in CASES.items():
            trainer = _trainer(width, layers)
            params = [p for g in trainer.optimizer.param_groups for p in g["params"]]
            if not all(isinstance(p, torch.distributed.tensor.DTensor) for p in params):
                raise RuntimeError("the data-parallel plan's parameters should be DTensors")
            nbytes = sum(_local(p).numel() * _local(p).element_size() for p in params)
            got[name] = [_timed_s(trainer), nbytes, len(params)]
        if rank == 0:
            Path(out_path).write_text(json.dumps(got))
    finally:
        end_process_group()


@pytest.fixture(scope="module")
def timed(tmp_path_factory) -> dict:
    import torch.multiprocessing as mp

    tmp = tmp_path_factory.mktemp("optimizer")
    mp.start_processes(_worker, args=(str(tmp / "store"), str(tmp / "out.json")), nprocs=2,
                       start_method="spawn")
    return json.loads((tmp / "out.json").read_text())


@pytest.mark.distributed
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_priced_optimizer_part_matches_the_timed_step(timed, case):
    """Each case's optimizer part priced within :data:`TOLERANCE` of its timed median."""
    measured, nbytes, tensors = timed[case]
    priced = optimizer_time_s(load_device("cpu"), nbytes, tensors, "adamw")
    print(f"{case}: {tensors} tensors, {nbytes} B: timed {measured * 1e3:.3f} ms, "
          f"priced {priced * 1e3:.3f} ms")
    assert abs(priced - measured) <= TOLERANCE * measured, (case, priced, measured, tensors, nbytes)


def test_sgd_keeps_the_copy_bandwidth():
    """Only the fused Adam / AdamW kernel takes the optimizer bandwidth: SGD's foreach passes stay priced
    at the memory bandwidth x efficiency."""
    device = load_device("cpu")
    copy = device.memory_bandwidth_gbps * 1e9 * device.memory_efficiency
    sgd = optimizer_time_s(device, 2**20, 1, "sgd")
    assert sgd == pytest.approx(3 * 2**20 / copy + device.optimizer_tensor_s)
    fused = optimizer_time_s(device, 2**20, 1, "adamw") - device.optimizer_tensor_s
    assert fused == pytest.approx(7 * 2**20 / (device.optimizer_bandwidth_gbps * 1e9))


def test_the_fit_keeps_both_constants_non_negative():
    """Points where more bytes took less time give no byte term (an infinite bandwidth), not a negative
    one, and the tensors alone (~10 us each); a fit recovers the constants that made the points; too few
    points are refused."""
    gbps, per_tensor = fit_optimizer_time([2**24, 2**10, 2**20], [10, 10, 20], [0.8e-4, 1e-4, 2e-4])
    assert gbps == float("inf") and 8e-6 < per_tensor < 1e-5
    nbytes, tensors = [2**22, 2**18, 2**24, 2**12], [4, 64, 16, 128]
    times = [7 * b / 30e9 + n * 2e-5 for b, n in zip(nbytes, tensors)]
    assert fit_optimizer_time(nbytes, tensors, times) == pytest.approx((30.0, 2e-5))
    with pytest.raises(ValueError, match="two or more steps"):
        fit_optimizer_time([1], [1], [1e-3])
