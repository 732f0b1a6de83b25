"""Models with ops that cannot run on CPU processes (custom ops registered through torch.library)."""

from __future__ import annotations

import torch
from torch import nn

_LIB = torch.library.Library("tensoropt_test", "DEF")
_LIB.define("meta_only(Tensor x) -> Tensor")
_LIB.impl("meta_only", lambda x: torch.empty_like(x), "Meta")  # shapes only: a CUDA kernel would go elsewhere
_LIB.define("no_backward(Tensor x) -> Tensor")
_LIB.impl("no_backward", lambda x: x * 2, "CPU")
_LIB.impl("no_backward", lambda x: torch.empty_like(x), "Meta")


class MetaOnly(nn.Module):
    """A linear layer, then a custom op with a meta kernel only (it can be captured, never run)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = Act(torch.ops.tensoropt_test.meta_only)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x)).sum()


class NoBackward(MetaOnly):
    """A linear layer, then a custom op with a CPU kernel but no autograd formula."""

    def __init__(self):
        super().__init__()
        self.act = Act(torch.ops.tensoropt_test.no_backward)


class Act(nn.Module):
    """Applies one op (so the op sits in a named submodule, ``act``)."""

    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x)
