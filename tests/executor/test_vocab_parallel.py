"""The vocabulary-parallel cross entropy's local pieces (tensoropt/executor/ops/vocab_parallel.py).

Its 2- and 4-process runs are in the parity tests (tests/executor/test_parity.py: the GPT's
tensor-parallel plan and the CNN's input-channel plan split the logits on the class dim)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.tensor import Replicate, Shard

from tensoropt.executor.ops.vocab_parallel import class_columns, row_losses


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_row_losses_and_gradient_equal_the_fused_op(dtype):
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(12, 37, generator=gen, dtype=dtype) * 4).requires_grad_()
    labels = torch.randint(0, 37, (12,), generator=gen)
    labels[3] = -100  # ignored: masked by the caller
    weights = torch.rand(12, generator=gen, dtype=dtype)
    mine = row_losses(logits, labels, 0, [])
    (grad_mine,) = torch.autograd.grad((mine * weights * (labels != -100)).sum(), logits)
    ref = F.cross_entropy(logits, labels, reduction="none")
    (grad_ref,) = torch.autograd.grad((ref * weights).sum(), logits)
    keep = labels != -100
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    assert torch.allclose(mine[keep], ref[keep], atol=tol, rtol=tol)
    assert torch.allclose(grad_mine, grad_ref, atol=tol, rtol=tol)


def test_a_label_in_another_ranks_columns_picks_nothing_here():
    logits = torch.zeros(2, 4)
    # this rank holds classes 4..7: the first label is another rank's, the second is local column 1
    rows = row_losses(logits, torch.tensor([2, 5]), vocab_start=4, groups=[])
    assert torch.allclose(rows, torch.tensor([4.0, 4.0]).log())  # log-sum-exp only, then minus z = 0


def test_half_precision_logits_are_reduced_in_float32():
    logits = torch.randn(4, 50, dtype=torch.bfloat16).requires_grad_()
    labels = torch.tensor([0, 7, 49, 3])
    rows = row_losses(logits, labels, 0, [])
    assert rows.dtype == torch.bfloat16
    ref = F.cross_entropy(logits.float(), labels, reduction="none")
    assert torch.allclose(rows.float(), ref, atol=2e-2)
    rows.sum().backward()
    assert logits.grad.dtype == torch.bfloat16


@pytest.mark.parametrize("n,k", [(10, 4), (8, 2), (7, 2), (3, 4), (50257, 8)])
def test_class_columns_are_the_chunks_dtensor_lays_out(n, k):
    chunks = torch.arange(n).chunk(k)
    got = [class_columns(n, (Shard(1),), (c,), (k,)) for c in range(k)]
    want = [(int(chunks[c][0]) if c < len(chunks) and len(chunks[c]) else None,
             len(chunks[c]) if c < len(chunks) else 0) for c in range(k)]
    assert [w for _, w in got] == [w for _, w in want]
    assert [s for (s, w) in got if w] == [s for (s, w) in want if w]


def test_class_columns_nest_over_two_mesh_axes_and_skip_other_splits():
    # dim 1 split over both axes of a 2 x 2 mesh: axis 0 halves 10 columns, axis 1 halves each half
    got = {(i, j): class_columns(10, (Shard(1), Shard(1)), (i, j), (2, 2))
           for i in range(2) for j in range(2)}
    assert got == {(0, 0): (0, 3), (0, 1): (3, 2), (1, 0): (5, 3), (1, 1): (8, 2)}
    # a batch split on axis 0 does not move the columns
    assert class_columns(10, (Shard(0), Shard(1)), (1, 1), (2, 2)) == (5, 5)
    assert class_columns(10, (Replicate(),), (1,), (2,)) == (0, 10)


@pytest.mark.parametrize("reduction", [1, 2])
def test_class_split_loss_mean_and_sum_leave_ignored_rows_out(tmp_path, reduction):
    """Mean (HF's default) and sum (HF's ``num_items_in_batch`` form) of a class-sharded DTensor on a
    1-rank mesh equal ``F.cross_entropy(ignore_index=-100)``, value and gradient, with -100 rows."""
    import torch.distributed as dist
    from torch.distributed.tensor import DeviceMesh, DTensor

    from tensoropt.executor.ops.vocab_parallel import class_split_cross_entropy
    from tensoropt.executor.state.worker import end_process_group

    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(10, 7, generator=gen)
    labels = torch.randint(0, 7, (10,), generator=gen)
    labels[[0, 4, 5]] = -100
    ref_logits = logits.clone().requires_grad_()
    ref = F.cross_entropy(ref_logits, labels, ignore_index=-100, reduction={1: "mean", 2: "sum"}[reduction])
    ref.backward()
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        mesh = DeviceMesh("cpu", [0])
        local = logits.clone().requires_grad_()
        z = DTensor.from_local(local, mesh, [Shard(1)], run_check=False)
        loss = class_split_cross_entropy(z, labels, -100, reduction)
        loss.full_tensor().backward()
        assert torch.allclose(loss.full_tensor(), ref, atol=1e-6)
        assert torch.allclose(local.grad, ref_logits.grad, atol=1e-6)
    finally:
        end_process_group()
