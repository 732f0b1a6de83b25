"""A plan in your own training loop (docs/user-guide.md, "Your own training loop").

Plan a job, then train its plan with your optimizer, scheduler and loader, and write the model out:

    tensoropt plan configs/jobs/hf-gpt2.yaml --out out/hf-gpt2
    torchrun --nproc-per-node 2 examples/train_loop.py out/hf-gpt2/plan.json --steps 20 \
        --out out/hf-gpt2-model

The model is built as the plan's job builds it (its ``model.factory`` with ``model.kwargs``), on the
meta device: ``tensoropt.parallelize`` gives it ``tensoropt run``'s seeded initial weights, only
this rank's shards. For fine-tuning, pass ``--pretrained DIR`` (a ``save_pretrained`` directory):
the model is then read with ``from_pretrained`` and each rank keeps only its shards. The batches
are random tokens of the job's ``model.inputs`` (replace ``loader`` by your data).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math

import torch

import tensoropt


def build_model(job: dict, pretrained: str | None) -> torch.nn.Module:
    """The nn.Module the job's factory builds: on meta, or read from a save_pretrained directory."""
    if pretrained:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(pretrained)
    from tensoropt.models.registry import load_factory

    with torch.device("meta"):
        return load_factory(job["model"]["factory"])(**job["model"].get("kwargs", {}))


def loader(job: dict, steps: int, seed: int = 0):
    """``steps`` global batches of random values for the job's ``model.inputs`` (labels = input ids)."""
    g = torch.Generator().manual_seed(seed)
    inputs = job["model"]["inputs"]
    batch_size = job["training"]["global_batch_size"] * 2  # two micro-batches of the plan's batch
    for _ in range(steps):
        batch = {}
        for name, spec in inputs.items():
            shape = (batch_size, *spec["shape"])
            if spec["dtype"].startswith("int"):
                batch[name] = torch.randint(0, spec["high"], shape, generator=g)
            else:
                batch[name] = torch.randn(shape, generator=g)
        if "labels" in batch and "input_ids" in batch:
            batch["labels"] = batch["input_ids"].clone()
        yield batch


def warmup_cosine(steps: int, warmup: int = 2):
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    return factor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plan", help="a plan.json written by `tensoropt plan` / `tensoropt select`")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default="out/model", help="where save_model writes the trained model")
    parser.add_argument("--pretrained", default=None, help="a save_pretrained directory to fine-tune")
    args = parser.parse_args()

    rank, _ = tensoropt.init_distributed()
    job = json.load(open(args.plan))["job"]
    model = build_model(job, args.pretrained)

    pm = tensoropt.parallelize(model, args.plan)  # model: the nn.Module the job's factory builds
    decay = [p for n, p in pm.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in pm.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=3e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(args.steps))
    for step, batch in enumerate(loader(job, args.steps)):  # batch: the job's input names -> tensors
        mbs = tensoropt.micro_batches(batch, 2)  # gradient accumulation
        losses = []
        for i, mb in enumerate(mbs):
            with pm.no_sync() if i < len(mbs) - 1 else contextlib.nullcontext():
                losses.append(pm.train_step(mb, loss_scale=1 / len(mbs)))  # forward + loss + backward
        norm = pm.clip_grad_norm_(1.0)  # global norm over every shard, each counted once
        opt.step()
        sched.step()
        opt.zero_grad()
        if rank == 0:
            print(f"step {step}: loss {float(sum(losses)) / len(losses):.4f}, grad norm {float(norm):.4f}, "
                  f"lr {sched.get_last_lr()[0]:.2e}", flush=True)
    out = pm.eval_step(batch)  # forward only: the loss, no state change
    if rank == 0:
        print(f"eval loss {float(out):.4f}", flush=True)
    tensoropt.save_model(pm, args.out)  # one consolidated model others can load
    if rank == 0:
        print(f"saved {args.out}", flush=True)


if __name__ == "__main__":
    try:
        main()
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
