"""The optimizer step's priced time against torch's fused AdamW as the executor steps it (thread clock).

The cpu profile prices AdamW's 7 parameter-sized passes at ``optimizer_bandwidth_gbps`` (the fused
kernel's measured rate) plus ``optimizer_tensor_s`` per tensor (estimators/compute.py). Before, at the
copy bandwidth x efficiency and 5 us a tensor, a GPT-2-sized step (28 tensors, 2.1 M elements) was
priced 3.17 ms against ~1.8 ms measured (+75 %), outside the tolerance below.
"""

from __future__ import annotations

import statistics
import time

import pytest
import torch

from estimators.compute import optimizer_time_s
from estimators.profiles import load_device
from tensoropt.executor.state.local_optim import step_local

TOLERANCE = 0.35
"""Priced within 35 % of the measured step (thread CPU time, median of 15; the profile's fit is
within 4-20 % of its six measured points: configs/devices/cpu.yaml)."""


def _timed_adamw_s(tensors: int, numel: int) -> float:
    """Median thread-CPU seconds of ``step_local`` (fused AdamW) over ``tensors`` x ``numel`` float32
    parameters, a 64 MiB buffer written before each step to evict the caches (as backward does)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a worker's one thread (torchrun's default), as the profile is timed
    try:
        params = [torch.nn.Parameter(torch.randn(numel)) for _ in range(tensors)]
        for p in params:
            p.grad = torch.randn_like(p)
        opt = torch.optim.AdamW(params, lr=1e-3)
        flush = torch.empty(16 * 2**20)
        step_local(opt)  # the state is made on the first step
        times = []
        for _ in range(15):
            flush.fill_(1.0)
            t0 = time.thread_time()
            step_local(opt)
            times.append(time.thread_time() - t0)
        return statistics.median(times)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("tensors, numel", [(28, 76_000), (256, 1024)], ids=["gpt2-sized", "many-small"])
def test_the_priced_adamw_step_matches_a_timed_fused_step(tensors, numel):
    """GPT-2's 2 x 256 parameter count in 28 tensors (the bytes dominate) and 256 tensors of 1 Ki
    elements (the per-tensor time dominates): each priced within :data:`TOLERANCE` of the timed step."""
    device = load_device("cpu")
    priced = optimizer_time_s(device, 4 * tensors * numel, tensors, "adamw")
    measured = _timed_adamw_s(tensors, numel)
    assert abs(priced - measured) <= TOLERANCE * measured, (priced, measured)


def test_sgd_keeps_the_copy_bandwidth():
    """Only the fused Adam / AdamW kernel takes the optimizer bandwidth: SGD's foreach passes stay priced
    at the memory bandwidth x efficiency."""
    device = load_device("cpu")
    copy = device.memory_bandwidth_gbps * 1e9 * device.memory_efficiency
    sgd = optimizer_time_s(device, 2**20, 1, "sgd")
    assert sgd == pytest.approx(3 * 2**20 / copy + device.optimizer_tensor_s)
    fused = optimizer_time_s(device, 2**20, 1, "adamw") - device.optimizer_tensor_s
    assert fused == pytest.approx(7 * 2**20 / (device.optimizer_bandwidth_gbps * 1e9))
