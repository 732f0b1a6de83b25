"""Run a program of K all-gathers in flight at once, IT times, on 2 gloo processes; check every output.

``python -m torch.distributed.run --standalone --nproc-per-node 2 gloo_gathers_worker.py MODE K IT``

MODE ``plain``: the program as :func:`tensoropt.executor.ops.gloo_gathers.plain_gathers` rewrites it;
``functional``: torch's functional all-gathers as traced (with K = 70 and IT = 100, one launch in
two aborts with ``malloc(): unaligned tcache chunk detected`` on torch 2.13: the reproducer of
the bug the rewrite works around).
"""

from __future__ import annotations

import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.fx as fx

from tensoropt.executor.ops.gloo_gathers import plain_gathers

_GATHER = torch.ops._c10d_functional.all_gather_into_tensor.default
_WAIT = torch.ops._c10d_functional.wait_tensor.default


def program(k: int, group_name: str) -> fx.GraphModule:
    """k inputs, each all-gathered; every gather issued before the first wait (as a hoisting pass would)."""
    g = fx.Graph()
    xs = [g.placeholder(f"x{i}") for i in range(k)]
    gathers = []
    for x in xs:
        node = g.call_function(_GATHER, (x, 2, group_name))
        node.meta["val"] = torch.empty(0)  # a CPU tensor, as make_fx records it
        gathers.append(node)
    g.output(tuple(g.call_function(_WAIT, (n,)) for n in gathers))
    return fx.GraphModule(torch.nn.Module(), g)


def main() -> None:
    mode, k, iterations = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    gm = program(k, dist.group.WORLD.group_name)
    run = plain_gathers(gm) if mode == "plain" else gm
    assert (run is gm) == (mode != "plain"), "the rewrite must apply to CPU gathers"
    rows = [64 * (1 + i % 3) for i in range(k)]
    for _ in range(iterations):
        inputs = [torch.full((r, 64), float(1000 * rank + i)) for i, r in enumerate(rows)]
        outputs = run(*inputs)
        del inputs
        for i, (r, out) in enumerate(zip(rows, outputs, strict=True)):
            expected = torch.cat([torch.full((r, 64), float(1000 * src + i)) for src in range(2)])
            assert torch.equal(out, expected), f"gather {i}: wrong values"
    dist.barrier()
    if rank == 0:
        print(f"ok {mode} {k}x{iterations}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
