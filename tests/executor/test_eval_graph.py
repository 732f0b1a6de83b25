"""The evaluation form of an exported training step (``pm.eval_step``'s graph) computes what
``model.eval()`` does: dropout off, batch norm on its running statistics, which stay as they were."""

from __future__ import annotations

import torch
from torch import nn

from tensoropt.executor.job.program import export_program
from tensoropt.executor.program.eval_graph import eval_graph_module


def test_the_eval_graph_of_a_training_export_equals_model_eval():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Dropout(0.5), nn.Linear(6, 2))
    for _ in range(3):  # running statistics away from their initial values
        model(torch.randn(8, 4) * 3 + 1)
    ep = export_program(model, (torch.randn(8, 4),))  # training mode: the graph the plan prices
    trained = ep.module()
    evaluated = eval_graph_module(trained)
    x = torch.randn(8, 4)
    model.eval()
    with torch.no_grad():
        expected = model(x)
        stats = {k: v.clone() for k, v in evaluated.state_dict().items() if "running" in k}
        got = evaluated(x)
        training = trained(x)
    assert torch.allclose(got, expected, atol=1e-6)
    assert not torch.allclose(training, expected, atol=1e-3)  # the training graph differs
    assert all(torch.equal(v, evaluated.state_dict()[k]) for k, v in stats.items())
