"""What a checkpointed block's backward releases of the plan's memory before backward reaches an
earlier block: the parameters' compute-dtype copies the later blocks' checkpoints kept
(:func:`tensoropt.executor.state.block_backward.block_copy_bytes`, ``released_copy_bytes``), found on an
exported graph's block spans; and the rows' chains grouped by block where plan.json's rows name none
(:func:`tensoropt.executor.state.peak_memory.chains_by_block`)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from estimators.peak import recompute_excess_by_chain
from tensoropt.configspace.configuration import Configuration
from tensoropt.executor.job.program import signature
from tensoropt.executor.state.block_backward import block_copy_bytes, released_copy_bytes
from tensoropt.executor.state.block_checkpoint import block_spans
from tensoropt.executor.state.peak_memory import chains_by_block

WIDTH = 8
BF16 = 2


class Stack(torch.nn.Module):
    """An input projection, three residual linear layers (the repeated blocks), a head."""

    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(WIDTH, WIDTH)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(WIDTH, WIDTH, bias=i != 1) for i in range(3))
        self.head = torch.nn.Linear(WIDTH, 2)

    def forward(self, x):
        h = self.inp(x)
        for layer in self.layers:
            h = h + torch.relu(layer(h))
        return self.head(h)


def test_the_later_blocks_copies_are_released():
    ep = torch.export.export(Stack(), (torch.randn(4, WIDTH),))
    sig = signature(ep)
    option = Configuration("replicate,block_recompute", (), (), (), (), options=("block_recompute",))
    plain = Configuration("replicate", (), (), (), ())
    placements = {n.name: option if "layers" in str(n.meta.get("nn_module_stack")) else plain
                  for n in ep.graph.nodes if n.op == "call_function"}
    spans = block_spans(ep.graph, placements, set())
    assert [s.name for s in spans.values()] == ["layers.0", "layers.1", "layers.2"]
    numel = {name: p.numel() for name, p in Stack().named_parameters()}
    copies = {ph: numel[key] * BF16 for ph, key in sig.params.items()}
    per_block = block_copy_bytes(spans.values(), copies)
    weight, bias = WIDTH * WIDTH * BF16, WIDTH * BF16
    assert per_block == {"layers.0": weight + bias, "layers.1": weight, "layers.2": weight + bias}, per_block
    assert released_copy_bytes(per_block) == {"layers.0": 2 * weight + bias, "layers.1": weight + bias,
                                              "layers.2": 0}
    assert block_copy_bytes(spans.values(), {}) == {"layers.0": 0, "layers.1": 0, "layers.2": 0}


def test_rows_without_block_names_give_the_blocks_excess():
    rows = [{"node": "a", "grad_bytes": 10, "activation_bytes": 5},
            {"node": "b", "block": "h.0", "recompute_chain_bytes": 40, "grad_bytes": 10,
             "activation_bytes": 1},
            {"node": "c", "block": "h.0", "recompute_chain_bytes": 40, "grad_bytes": 10},
            {"node": "d", "block": "h.1", "recompute_chain_bytes": 30, "grad_bytes": 10},
            {"node": "e", "grad_bytes": 10, "activation_bytes": 8}]
    named = recompute_excess_by_chain(rows)
    bare = [{k: v for k, v in r.items() if k != "block"} for r in rows]  # as `tensoropt select` writes them
    by_node = recompute_excess_by_chain(bare)
    assert set(by_node) == {"b", "c", "d"} and by_node["b"] > named["h.0"]  # b's own chain: too few gradients
    spans = [SimpleNamespace(name="h.0", nodes=[SimpleNamespace(name="b"), SimpleNamespace(name="c")]),
             SimpleNamespace(name="h.1", nodes=[SimpleNamespace(name="d")])]
    assert chains_by_block(by_node, spans, bare) == named == {"h.0": 40 - 30 - 8 - 0.0, "h.1": 30 - 40 - 8.0}
    assert chains_by_block(named, spans, rows) == named
