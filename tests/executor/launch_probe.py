"""A worker for the launcher's tests: ``python -m launch_probe OUT_DIR`` under torchrun.

Joins the process group torchrun describes (gloo, 60 s timeout), all-reduces ``rank + 1`` and
writes ``{"rank", "world_size", "sum", "master_port", "shared_store", "malloc"}`` (the glibc
malloc variables it was started with) to ``OUT_DIR/rank<r>.json``.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    try:
        t = torch.tensor([dist.get_rank() + 1.0])
        dist.all_reduce(t)
        result = {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "sum": float(t.item()),
                  "master_port": int(os.environ["MASTER_PORT"]),
                  "shared_store": os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") != "1",
                  "malloc": {k: os.environ.get(k) for k in ("MALLOC_TOP_PAD_", "GLIBC_TUNABLES")}}
        (Path(sys.argv[1]) / f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
