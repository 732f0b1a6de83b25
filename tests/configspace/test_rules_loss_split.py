"""The class (vocabulary) split of a cross entropy: offered where the executor's vocabulary-parallel
loss computes it exactly (tensoropt/executor/ops/vocab_parallel.py), not elsewhere."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tensoropt.capture import capture
from tensoropt.configspace import configurations
from tensoropt.configspace.configuration import Mesh


class _Head(torch.nn.Module):
    """A head and HF's causal-LM loss chain: upcast, flatten, labels padded with -100 and shifted."""

    def __init__(self, **loss_kwargs):
        super().__init__()
        self.head = torch.nn.Linear(8, 12, bias=False)
        self.loss_kwargs = loss_kwargs

    def forward(self, x, labels):
        logits = self.head(x).float()
        labels = F.pad(labels, (0, 1), value=-100)[..., 1:]
        return F.cross_entropy(logits.view(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100,
                               **self.loss_kwargs)


def _loss_labels(**loss_kwargs) -> list[str]:
    model = _Head(**loss_kwargs)
    g = capture(model, (torch.randn(4, 6, 8), torch.randint(0, 12, (4, 6))))
    (loss,) = [n for n, d in g.nx.nodes(data=True) if d["kind"] == "cross_entropy"]
    return [c.label for c in configurations(g, Mesh.for_cluster(2, 2))[loss]]


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_the_class_split_is_offered_for_a_mean_or_sum_loss(reduction):
    assert "out=2" in _loss_labels(reduction=reduction)


@pytest.mark.parametrize("loss_kwargs", [{"label_smoothing": 0.1}, {"weight": torch.ones(12)}])
def test_no_class_split_where_the_executor_would_refuse_it(loss_kwargs):
    labels = _loss_labels(**loss_kwargs)
    assert "out=2" not in labels and "batch=2" in labels
