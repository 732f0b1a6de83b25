"""The loss a traced step reports (tensoropt.executor.program.lowering.reported_loss).

A loss left a partial sum (each rank's share of a mean) is summed inside the traced program: its
all-reduce is issued where forward ends and, after ``defer_waits``, waited for only at the end,
so the step's reader (``parallel.runtime.read_loss``) has no blocking collective left (before
branch ``cnnfast`` it all-reduced the loss after the step, a second point where both ranks wait for
each other). A replicated loss and a plain tensor are reported as they are. One process, a 1-rank
gloo mesh; the 2-process parity tests (test_replay.py, test_mse_loss.py, test_batch_norm.py) check
the values.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from launch_helpers import one_rank_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate
from torch.fx.experimental.proxy_tensor import make_fx

from tensoropt.executor.program.lowering import defer_waits, reported_loss
from tensoropt.parallel.runtime import read_loss

C10D = torch.ops._c10d_functional


@pytest.fixture
def mesh(tmp_path):
    with one_rank_mesh(tmp_path) as one:
        yield one


def test_a_partial_loss_is_summed_in_the_program_and_waited_for_at_its_end(mesh, monkeypatch):
    specs = []

    def step(share, x):
        loss = DTensor.from_local(share, mesh, [Partial()], run_check=False)
        value, spec = reported_loss(loss)
        specs.append(spec)
        return value, (x * 2).relu()  # the rest of the step: backward, in a real one

    gm = make_fx(step)(torch.tensor(1.5), torch.ones(3))
    defer_waits(gm)
    order = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert order.count(C10D.all_reduce.default) == 1 and order.count(C10D.wait_tensor.default) == 1
    assert order.index(C10D.all_reduce.default) < order.index(torch.ops.aten.mul.Tensor)  # issued first
    assert order[-1] is C10D.wait_tensor.default  # waited for after the rest of the step
    assert specs[0].placements == (Replicate(),)
    value, _ = gm(torch.tensor(2.0), torch.ones(3))
    assert float(value) == 2.0  # one rank: the sum is its own share

    def no_collective(*args, **kwargs):
        raise AssertionError("read_loss ran a collective after the step")

    monkeypatch.setattr(dist, "all_reduce", no_collective)
    assert float(read_loss(DTensor(value, specs[0], requires_grad=False))) == 2.0


def test_a_replicated_loss_and_a_plain_tensor_are_reported_as_they_are(mesh):
    replicated = DTensor.from_local(torch.tensor(3.0), mesh, [Replicate()], run_check=False)
    value, spec = reported_loss(replicated)
    assert spec is replicated._spec and float(value) == 3.0
    value, spec = reported_loss(torch.tensor(4.0, requires_grad=True))
    assert spec is None and not value.requires_grad and float(value) == 4.0
