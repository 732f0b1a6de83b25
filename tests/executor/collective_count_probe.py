"""torchrun worker of test_collective_count.py: each hand plan traced once under
``benchmarks/collective_match.py``'s :class:`Attribution`; rank 0 writes its program's collectives.

``python collective_count_probe.py OUT PLAN_ID...`` (the plans of ``hand_plans.all_plans(2)`` and
``hand_plans.cls_plans()``), with its losses over 3 steps.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist
from collective_match import Attribution, program_collectives
from hand_plans import SPECS, all_plans, cls_plans

from tensoropt.executor.job.plan import ExecPlan
from tensoropt.executor.state.worker import end_process_group, init_process_group
from tensoropt.training.trainer import Trainer


def main(out: str, plan_ids: list[str]) -> None:
    init_process_group()
    got = {}
    try:
        for name, plan in [*all_plans(dist.get_world_size()), *(("cls", p) for p in cls_plans())]:
            if plan["id"] not in plan_ids:
                continue
            trainer = Trainer(SPECS[name], ExecPlan.from_json(plan), mode="replay")
            with Attribution() as att:
                losses = [s["loss"] for s in trainer.train(3).steps]  # steps 1 and 2 replayed
            lowered = list(trainer.graph.program.programs.values())[-1][0]
            got[plan["id"]] = {"collectives": program_collectives(lowered.gm, att), "losses": losses}
        if dist.get_rank() == 0:
            Path(out).write_text(json.dumps(got))
    finally:
        end_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
