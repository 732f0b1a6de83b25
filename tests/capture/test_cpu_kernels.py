"""An op a meta trace records with a dtype its CPU kernel lacks (tensoropt/capture/cpu_kernels.py).

The reproducer is HuggingFace's mixture-of-experts routing (transformers/integrations/moe.py): it
counts tokens per expert with ``histc`` on float ids on the CPU and on int ids elsewhere, so a
meta export recorded an integer ``histc`` that Mixtral and Qwen2-MoE then could not run on CPU
processes ("histogram_cpu" not implemented for 'Int'). The matrix's CI sample runs Mixtral itself
(tests/hf/test_model_matrix.py).
"""

from __future__ import annotations

import torch
from torch import nn

from tensoropt.capture.export import export_program


class Router(nn.Module):
    """Routes each token to its top expert and weighs the output by the expert's share of tokens,
    picking histc's dtype by device as transformers does."""

    def __init__(self, width: int = 8, experts: int = 4):
        super().__init__()
        self.experts = experts
        self.gate = nn.Linear(width, experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = self.gate(x).argmax(-1).flatten()
        counts_in = ids.float() if x.device.type in ("cpu", "mps") else ids.int()
        counts = torch.histc(counts_in, bins=self.experts, min=0, max=self.experts - 1)
        share = counts.to(x.dtype)[ids] / ids.numel()
        return (self.gate(x).flatten(0, 1) * share[:, None]).sum()


def test_a_meta_export_of_an_integer_histc_runs_on_the_cpu_and_counts_the_same():
    torch.manual_seed(0)
    model = Router()
    x = torch.randn(3, 5, 8)
    expected = model(x)
    with torch.device("meta"):
        meta_model = Router()
    ep = export_program(meta_model, (torch.empty(3, 5, 8, device="meta"),))
    histc = [n for n in ep.graph.nodes if n.target == torch.ops.aten.histc.default]
    assert len(histc) == 1 and histc[0].args[0].meta["val"].dtype == torch.float32
    (counts,) = histc[0].users
    assert counts.meta["val"].dtype == torch.int32  # the rest of the graph keeps its traced dtypes
    params = {**dict(model.named_parameters())}
    out = torch.func.functional_call(ep.module(), params, (x,))
    assert torch.equal(out, expected)


def test_a_float_histc_is_left_alone():
    class Floats(nn.Module):
        def forward(self, x):
            return torch.histc(x, bins=3, min=0, max=1).sum()

    ep = export_program(Floats(), (torch.rand(6),))
    casts = [n for n in ep.graph.nodes if n.target == torch.ops.aten._to_copy.default]
    assert casts == []
