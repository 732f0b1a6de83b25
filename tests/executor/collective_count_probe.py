"""torchrun worker of test_collective_count.py: each hand plan traced once under
``benchmarks/collective_match.py``'s :class:`Attribution`; rank 0 writes its program's collectives.

``python collective_count_probe.py OUT PLAN_ID...`` (the plans of ``hand_plans.all_plans(2)``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist
from collective_match import Attribution, program_collectives
from hand_plans import SPECS, all_plans

from tensoropt.executor.job.plan import ExecPlan
from tensoropt.executor.state.worker import end_process_group, init_process_group
from tensoropt.training.trainer import Trainer


def main(out: str, plan_ids: list[str]) -> None:
    init_process_group()
    got = {}
    try:
        for name, plan in all_plans(dist.get_world_size()):
            if plan["id"] not in plan_ids:
                continue
            trainer = Trainer(SPECS[name], ExecPlan.from_json(plan), mode="replay")
            with Attribution() as att:
                trainer.train(2)
            lowered = list(trainer.graph.program.programs.values())[-1][0]
            got[plan["id"]] = program_collectives(lowered.gm, att)
        if dist.get_rank() == 0:
            Path(out).write_text(json.dumps(got))
    finally:
        end_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
