"""Run by tests/parallel/test_eval_step.py under torchrun: a dropout model parallelized, trained two
steps, then ``pm.eval_step``; rank 0 writes the eval loss, the trained state and the batch.

``python eval_worker.py PLAN.json KWARGS.json OUT.pt``
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import tensoropt


def main() -> None:
    tensoropt.init_distributed()
    plan, kwargs, out = sys.argv[1], json.loads(Path(sys.argv[2]).read_text()), sys.argv[3]
    try:
        from tensoropt.models.gpt import GPT

        torch.manual_seed(0)
        model = GPT(**kwargs)
        pm = tensoropt.parallelize(model, plan)
        opt = torch.optim.SGD(pm.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(5)
        vocab, seq = kwargs["vocab_size"], kwargs["seq_len"]
        batches = [torch.randint(0, vocab, (4, seq), generator=g) for _ in range(3)]
        names = pm.input_names
        for ids in batches[:2]:
            pm.train_step({names[0]: ids, names[1]: ids})
            opt.step()
            opt.zero_grad()
        eval_batch = {names[0]: batches[2], names[1]: batches[2]}
        rng = torch.get_rng_state()
        losses = [float(pm.eval_step(eval_batch)) for _ in range(2)]
        state = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
                 for k, v in pm.state_dict().items()}
        if dist.get_rank() == 0:
            torch.save({"eval": losses, "state": state, "batch": batches[2],
                        "rng_unchanged": torch.equal(rng, torch.get_rng_state())}, out)
        dist.barrier()
    finally:
        from tensoropt.executor.state.worker import end_process_group

        end_process_group()


if __name__ == "__main__":
    main()
