"""The saved-tensor recipes behind recompute and zero3 (single process, plain tensors)."""

from __future__ import annotations

import torch

from tensoropt.executor.state.memory import SavedTensors
from tensoropt.executor.state.options import Recipes


def test_views_of_a_recipe_tensor_are_rebuilt_once_and_not_kept():
    x = torch.randn(4, 6, requires_grad=True)
    w = torch.randn(6, 5, requires_grad=True)
    calls = []
    with SavedTensors() as saved, Recipes() as recipes:
        y = torch.tanh(x)  # tanh saves its output: kept (no recipe)
        h = x * 3.0
        recipes.register(h, lambda: calls.append(1) or (x.detach() * 3.0))
        z = (h.t().t() @ w).sum() + (h[:, 1:] * h[:, 1:]).sum() + y.sum()
    kept = saved.bytes()
    z.backward()
    ref_x, ref_w = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    ref_h = ref_x * 3.0
    ((ref_h @ ref_w).sum() + (ref_h[:, 1:] ** 2).sum() + torch.tanh(ref_x).sum()).backward()
    assert torch.allclose(x.grad, ref_x.grad) and torch.allclose(w.grad, ref_w.grad)
    assert len(calls) == 1  # three saved views of h, one rebuild
    # kept: tanh's output and w (the matmul's saved weight); h and its views are recipes
    assert kept == 4 * 6 * 4 + 6 * 5 * 4


def test_without_recipes_everything_goes_to_the_outer_hooks():
    x = torch.randn(3, requires_grad=True)
    with SavedTensors() as saved, Recipes():
        (x.exp() * 2).sum().backward()
    assert saved.bytes() == 3 * 4
