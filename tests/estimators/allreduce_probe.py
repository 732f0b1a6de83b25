"""A worker for tests/estimators/test_collectives.py: ``python -m allreduce_probe OUT SIZES ITERS``.

Run under torchrun on 2 processes: joins the gloo group torchrun describes, times ITERS
all-reduces of each float32 message size in SIZES (comma-separated bytes; each after a barrier,
two warm-up calls first) and rank 0 writes ``{size: fastest seconds}`` to the JSON file OUT
(the fastest call: the least disturbed by other load on a shared machine).
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    out, sizes, iters = Path(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    try:
        fastest = {}
        for nbytes in sizes:
            t = torch.ones(nbytes // 4)
            for _ in range(2):
                dist.all_reduce(t)
            times = []
            for _ in range(iters):
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce(t)
                times.append(time.perf_counter() - start)
            fastest[nbytes] = min(times)
        if dist.get_rank() == 0:
            out.write_text(json.dumps(fastest))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
