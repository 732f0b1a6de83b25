"""The device side of a rank: its device type, a plan's DeviceMesh, and small cross-rank helpers.

Example:
    >>> device_type() in ("cpu", "cuda")
    True
    >>> contiguous_stride((2, 3, 4))
    (12, 4, 1)
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DeviceMesh

from tensoropt.executor.job.plan import ExecPlan


def device_type() -> str:
    """``"cuda"`` when a GPU is visible, else ``"cpu"``.

    Example:
        >>> device_type() in ("cpu", "cuda")
        True
    """
    return "cuda" if torch.cuda.is_available() else "cpu"


def rank_device() -> torch.device:
    """This rank's device: its current CUDA device, or the CPU.

    Example:
        >>> rank_device().type in ("cpu", "cuda")
        True
    """
    if device_type() == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def build_mesh(plan: ExecPlan) -> DeviceMesh | None:
    """The DeviceMesh of a plan (axes ``a0``, ``a1``, ...), or None for a 1-device plan.

    Example:
        >>> build_mesh(plan)  # needs a process group  # doctest: +SKIP
    """
    world = dist.get_world_size() if dist.is_initialized() else 1
    if not plan.mesh.shape and world == 1:
        return None
    if plan.devices != world:
        raise ValueError(
            f"plan {plan.plan_id} needs {plan.devices} processes but {world} are running; "
            f"launch with --nproc {plan.devices}"
        )
    names = tuple(f"a{i}" for i in range(len(plan.mesh.shape)))
    return init_device_mesh(device_type(), tuple(plan.mesh.shape), mesh_dim_names=names)


def contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a contiguous tensor of ``shape``.

    Example:
        >>> contiguous_stride((4, 0, 2))
        (2, 2, 1)
    """
    stride, out = 1, []
    for n in reversed(shape):
        out.append(stride)
        stride *= max(n, 1)
    return tuple(reversed(out))


def sync_device() -> None:
    """Wait for the GPU's queued work (nothing on a CPU): step times end here.

    Example:
        >>> sync_device()
    """
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def max_over_ranks(value: int) -> int:
    """The largest ``value`` over the ranks (a collective when a process group runs).

    Example:
        >>> max_over_ranks(3)
        3
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device_type())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())
