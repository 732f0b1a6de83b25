"""The plain 1-process PyTorch loop the parallel loop must equal, and what both share.

The same HF model (real weights from a seed), AdamW with two param groups (weight decay on the
matrices only), a linear-warmup + cosine LambdaLR, ``torch.nn.utils.clip_grad_norm_`` and gradient
accumulation over micro-batches (each micro-batch's loss scaled by ``1 / n``).
"""

from __future__ import annotations

import math

import torch

WARMUP = 2


def build_model(kind: str, config: dict, seed: int = 0) -> torch.nn.Module:
    """An HF model (``gpt2`` | ``llama``) from its config with weights drawn from ``seed``."""
    from tensoropt.models import hf

    torch.manual_seed(seed)
    return getattr(hf, kind)(**config)


def make_batch(case: dict, step: int) -> dict[str, torch.Tensor]:
    """Step ``step``'s global batch: random token ids (labels = inputs, the causal-LM loss)."""
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(0, case["vocab"], (case["batch"], case["seq"]), generator=g)
    return {"input_ids": ids, "labels": ids.clone()}


def warmup_cosine(total_steps: int):
    def factor(step: int) -> float:
        if step < WARMUP:
            return (step + 1) / WARMUP
        return 0.5 * (1 + math.cos(math.pi * (step - WARMUP) / max(1, total_steps - WARMUP)))

    return factor


def make_optimizer(model, steps: int, lr: float = 1e-3):
    """AdamW over two param groups (decay on tensors of 2 dims or more) and its LambdaLR."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=lr)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(steps))


def reference(case: dict) -> dict:
    """Losses, gradient norms, eval loss and final state dict of the plain loop."""
    model = build_model(case["model"], case["config"], case.get("seed", 0))
    model.train()
    opt, sched = make_optimizer(model, case["steps"])
    losses, norms = [], []
    for step in range(case["steps"]):
        batch = make_batch(case, step)
        n = case["micro"]
        rows = case["batch"] // n
        total = 0.0
        for i in range(n):
            mb = {k: v[i * rows:(i + 1) * rows] for k, v in batch.items()}
            loss = model(**mb).loss
            (loss / n).backward()
            total += float(loss.detach()) / n
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), case["max_norm"])))
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(total)
    with torch.no_grad():
        eval_loss = float(model(**make_batch(case, case["steps"])).loss)
    return {"losses": losses, "norms": norms, "eval": eval_loss,
            "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}
