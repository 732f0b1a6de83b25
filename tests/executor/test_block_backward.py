"""What backward through a checkpointed block holds beyond its rebuilt activations (the activation
gradients in flight, the block's parameter gradients made, less the rebuilt activations freed), from
the exported graph (:mod:`tensoropt.executor.state.block_backward`), against the hand count and against
autograd's tensors measured."""

from __future__ import annotations

import torch

from tensoropt.executor.job.program import signature
from tensoropt.executor.state.block_backward import activation_nodes, parameter_nodes, span_gradient_bytes
from tensoropt.executor.state.tensor_peak import TensorPeak

BATCH, WIDTH, HIDDEN = 256, 16, 64
F32 = 4


class Residual(torch.nn.Module):
    """An embedding-like linear, then one residual MLP block: h + fc2(gelu(fc1(h)))."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(WIDTH, WIDTH)
        self.fc1, self.fc2 = torch.nn.Linear(WIDTH, HIDDEN), torch.nn.Linear(HIDDEN, WIDTH)

    def forward(self, x):
        h = self.embed(x)
        return h + self.fc2(torch.nn.functional.gelu(self.fc1(h)))


def test_backward_through_a_residual_mlp_block():
    torch.manual_seed(0)
    model = Residual()
    x = torch.randn(BATCH, WIDTH)
    ep = torch.export.export(model, (x,))
    sig = signature(ep)
    nodes = [n for n in ep.graph.nodes if n.op == "call_function"]
    first = next(i for i, n in enumerate(nodes) if "fc1" in str(n.meta.get("nn_module_stack")))
    sizes = {n.name: n.meta["val"].numel() * F32 for n in ep.graph.nodes
             if isinstance(n.meta.get("val"), torch.Tensor)}
    activations = activation_nodes(ep.graph, sig.params, sig.user_inputs)
    params = parameter_nodes(ep.graph, sig.params, sig.user_inputs)
    predicted = span_gradient_bytes(nodes[first:], activations, sizes, param_values=params)
    # at fc2's backward: the residual stream's gradient (the skip holds it), the gradient fc2 makes for
    # its input and its parameters' gradients; gelu's output, which fc2 saved, is freed only after
    hand = (BATCH * WIDTH + BATCH * HIDDEN + HIDDEN * WIDTH + WIDTH) * F32
    assert predicted == hand, (predicted, hand)

    # measured: the most tensor bytes alive during backward above those alive when it starts (the
    # saved activations, the output), plus the output's gradient
    with TensorPeak(baseline_bytes=0) as peak:
        out = model(x)
        grad = torch.ones_like(out)
        before = peak.peak_bytes = peak.live_bytes
        out.backward(grad)
    assert peak.peak_bytes - before + grad.numel() * F32 == hand, (peak.peak_bytes - before, hand)
