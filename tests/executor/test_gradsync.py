"""GradSync: bucketed all-reduce of partial gradients, its flat buffers kept across steps (2 gloo ranks)."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]

SHAPES = [(64, 32), (32,), (300, 8)]


def _partial_grad(p, value: torch.Tensor):
    from torch.distributed.tensor import DTensor, Partial
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    spec = DTensorSpec(p.device_mesh, (Partial(),), tensor_meta=p._spec.tensor_meta)
    return DTensor(value, spec, requires_grad=False)


def _worker(rank: int, store_path: str, out_path: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    from tensoropt.executor.state.gradsync import GradSync
    from tensoropt.executor.state.worker import end_process_group

    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        params = [torch.nn.Parameter(distribute_tensor(torch.zeros(s), mesh, [Replicate()],
                                                       src_data_rank=None)) for s in SHAPES]
        sync = GradSync(params, bucket_bytes=4096, hooks=False)
        out = {"steps": [], "buffers": []}
        for step in range(3):
            local = [torch.full(s, float(10 * step + rank + 1)) for s in SHAPES]
            if step == 2:  # partial gradients that are the previous step's bucket views, added to in place
                for p, g in zip(params, local):
                    p.grad = _partial_grad(p, p.grad._local_tensor.add_(g))
            else:
                for p, g in zip(params, local):
                    p.grad = _partial_grad(p, g)
            for p in params:
                sync.add(p)
            sync.finish()
            out["steps"].append([p.grad._local_tensor.clone() for p in params])
            out["buffers"].append(sorted(b.data_ptr() for b in sync._buffers.values()))
            if step == 0:
                for p in params:
                    p.grad = None
        kept = sum(b.numel() * b.element_size() for b in sync._buffers.values())
        out["released"] = (kept, sync.release_buffers(), len(sync._buffers))
        if rank == 0:
            torch.save(out, out_path)
    finally:
        end_process_group()


def test_buckets_reduce_each_step_and_reuse_their_buffers(tmp_path):
    import torch.multiprocessing as mp

    out = tmp_path / "out.pt"
    mp.start_processes(_worker, args=(str(tmp_path / "store"), str(out)), nprocs=2, start_method="spawn")
    got = torch.load(out)
    step0 = [torch.full(s, 1.0 + 2.0) for s in SHAPES]  # rank 0 sent 1, rank 1 sent 2
    step1 = [torch.full(s, 11.0 + 12.0) for s in SHAPES]
    # each rank added its share onto the reduced gradient (a view of the bucket) and sent it round again
    step2 = [2 * b + torch.full(s, 21.0 + 22.0) for b, s in zip(step1, SHAPES)]
    for want, have in zip([step0, step1, step2], got["steps"]):
        for w, h in zip(want, have):
            assert torch.equal(w, h)
    # the bucket of step 1 is the buffer of step 0 (no allocation per step); step 2's gradients were
    # views of it, so that step flattened into a fresh one
    assert got["buffers"][1] == got["buffers"][0]
    assert got["buffers"][2] != got["buffers"][1]
    # a replaying trainer drops them after its interpreted step (the program has its own buckets)
    kept, freed, left = got["released"]
    assert kept >= 4 * sum(torch.Size(s).numel() for s in SHAPES) and freed == kept and left == 0
