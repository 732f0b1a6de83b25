"""The activation gradients in flight through a block's backward, from the exported graph
(:mod:`tensoropt.executor.state.block_backward`), against the hand count and against autograd."""

from __future__ import annotations

import torch

from tensoropt.executor.job.program import signature
from tensoropt.executor.state.block_backward import activation_nodes, span_gradient_bytes
from tensoropt.executor.state.tensor_peak import TensorPeak

BATCH, WIDTH, HIDDEN = 8, 16, 64


class Residual(torch.nn.Module):
    """An embedding-like linear, then one residual MLP block: h + fc2(gelu(fc1(h)))."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(WIDTH, WIDTH)
        self.fc1, self.fc2 = torch.nn.Linear(WIDTH, HIDDEN), torch.nn.Linear(HIDDEN, WIDTH)

    def forward(self, x):
        h = self.embed(x)
        return h + self.fc2(torch.nn.functional.gelu(self.fc1(h)))


def _block(ep):
    nodes = [n for n in ep.graph.nodes if n.op == "call_function"]
    first = next(i for i, n in enumerate(nodes) if "fc1" in str(n.meta.get("nn_module_stack")))
    return nodes[first:]


def test_in_flight_gradients_of_a_residual_mlp_block():
    model = Residual()
    x = torch.randn(BATCH, WIDTH)
    ep = torch.export.export(model, (x,))
    sig = signature(ep)
    activations = activation_nodes(ep.graph, sig.params, sig.user_inputs)
    block = _block(ep)
    sizes = {n.name: n.meta["val"].numel() * 4 for n in ep.graph.nodes
             if isinstance(n.meta.get("val"), torch.Tensor)}
    predicted = span_gradient_bytes(block, activations, sizes)
    # at gelu's backward: the gradient of its output (fc2's input) and of its input, both
    # BATCH x HIDDEN, and the residual stream's gradient (BATCH x WIDTH) the skip holds
    hand = (2 * BATCH * HIDDEN + BATCH * WIDTH) * 4
    assert predicted == hand, (predicted, hand)

    # autograd holds them: the most tensor bytes its backward through the block makes at once
    # (activation gradients only: autograd.grad for h, no parameter gradient is made), plus the
    # output's gradient, made before
    h = model.embed(x).detach().requires_grad_()
    out = h + model.fc2(torch.nn.functional.gelu(model.fc1(h)))
    grad = torch.ones_like(out)
    with TensorPeak(baseline_bytes=grad.numel() * 4) as peak:
        torch.autograd.grad(out, [h], grad)
    assert peak.peak_bytes == hand, (peak.peak_bytes, hand)
