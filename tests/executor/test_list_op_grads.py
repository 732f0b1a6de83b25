"""A list op's DTensor outputs (split, chunk, unbind, unsafe_split) where only some reach the loss:
backward gives the unread ones zero DTensor gradients (tensoropt.executor.ops.explicit_ops.every_output_grad)
instead of the plain zeros DTensor refuses ("aten.cat.default got mixed torch.Tensor and DTensor")."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DeviceMesh, DTensor, Replicate, Shard

from tensoropt.executor.ops.explicit_ops import every_output_grad, returns_tensor_list
from tensoropt.executor.state.worker import end_process_group

pytestmark = pytest.mark.timeout(120)

LIST_OPS = [
    (torch.ops.aten.split.Tensor, (2, -1), 1),
    (torch.ops.aten.split_with_sizes.default, ([1, 3, 2], -1), 2),
    (torch.ops.aten.chunk.default, (3, -1), 0),
    (torch.ops.aten.unbind.int, (1,), 2),
    (torch.ops.aten.unsafe_split.Tensor, (4, -1), 0),
]


@pytest.fixture
def mesh(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield DeviceMesh("cpu", [0])
    finally:
        end_process_group()


def _outputs(op, args, x):
    return op(torch.tanh(x), *args)  # of a non-leaf: the outputs are views of a value autograd tracks


@pytest.mark.parametrize(("op", "args", "used"), LIST_OPS, ids=lambda v: getattr(v, "__name__", None))
def test_unread_outputs_get_zero_dtensor_gradients(mesh, op, args, used):
    assert returns_tensor_list(op)
    whole = torch.linspace(-1, 1, 36).reshape(2, 3, 6)
    ref = whole.clone().requires_grad_()
    (_outputs(op, args, ref)[used] ** 2).sum().backward()

    for placements in ([Replicate()], [Shard(0)]):
        x = DTensor.from_local(whole.clone(), mesh, placements, run_check=False).requires_grad_()
        with pytest.raises(RuntimeError, match="mixed torch.Tensor and DTensor"):
            (_outputs(op, args, x)[used] ** 2).sum().backward()  # what DTensor does without the fix
        x.grad = None
        (every_output_grad(_outputs(op, args, x))[used] ** 2).sum().backward()
        assert isinstance(x.grad, DTensor)
        assert torch.allclose(x.grad.full_tensor(), ref.grad, atol=1e-6), (op, placements)


def test_plain_tensors_and_ops_of_one_result_pass_through(mesh):
    outs = torch.split(torch.ones(4, requires_grad=True) * 2, 2)
    assert every_output_grad(outs) is outs
    assert not returns_tensor_list(torch.ops.aten.topk.default)
    frozen = torch.split(DTensor.from_local(torch.ones(4), mesh, [Replicate()], run_check=False), 2)
    assert every_output_grad(frozen) is frozen  # no gradient wanted: nothing to do
