"""The optimizer step on local tensors (tensoropt.executor.state.local_optim) against torch's own step."""

from __future__ import annotations

import pytest
import torch

from tensoropt.executor.state.local_optim import fusable, step_local

OPTIMIZERS = {
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2),
    "adam-amsgrad": lambda ps: torch.optim.Adam(ps, lr=1e-2, amsgrad=True, weight_decay=0.1),
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9),
}


def _train(make, local: bool, steps: int = 5, columns: bool = False) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape, generator=gen)) for shape in ((33, 17), (17,), (5, 3, 2))]
    opt = make(params)
    for _ in range(steps):
        # gradients as views at odd offsets of one flat buffer, as the replayed program's buckets hand
        # them, or (columns) as column slices, as a ZeRO-1 shard cut along dim 1 has them
        flat = torch.randn(1 + sum(p.numel() for p in params), generator=gen)
        offset = 1
        for p in params:
            p.grad = flat[offset:offset + p.numel()].view(p.shape)
            if columns and p.dim() == 2:
                p.grad = torch.cat([p.grad, p.grad], dim=1)[:, 1:1 + p.shape[1]]
            offset += p.numel()
        step_local(opt) if local else opt.step()
        opt.zero_grad(set_to_none=True)
    return [p.detach() for p in params]


@pytest.mark.parametrize("columns", [False, True], ids=["bucket-views", "column-slices"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_step_local_equals_the_optimizers_own_step(name, columns):
    ours = _train(OPTIMIZERS[name], True, columns=columns)
    theirs = _train(OPTIMIZERS[name], False, columns=columns)
    start = _train(OPTIMIZERS[name], True, steps=0)
    for a, b, s in zip(ours, theirs, start):
        assert not torch.equal(a, s)  # the step moved the parameters
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_fusable_only_for_real_floating_tensors_with_counters_beside_them():
    w = torch.zeros(3)
    step = torch.tensor(0.0)
    assert fusable([w, w.double()], [step, step])
    assert not fusable([w.to(torch.complex64)], [step])
    assert not fusable([torch.zeros(3, dtype=torch.int64)], [step])
    assert not fusable([w], [torch.tensor(0.0, device="meta")])


def test_another_optimizer_is_refused_by_name():
    opt = torch.optim.RMSprop([torch.nn.Parameter(torch.zeros(1))])
    with pytest.raises(TypeError, match="RMSprop is not SGD, Adam or AdamW"):
        step_local(opt)
