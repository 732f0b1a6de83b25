"""The loss's forward/backward turn, priced from the graph (issue 25's measured micro-batch peak):
what the loss adds to the saved activations when its forward ends and its backward starts
(:func:`tensoropt.executor.state.peak_memory.loss_turn_bytes`), for the layouts a plan gives the logits
and the loss; a chunked loss adds nothing here (its chunk is priced as its recompute transient)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tensoropt.capture.export import export_program
from tensoropt.executor.job.plan import ExecPlan
from tensoropt.executor.state.peak_memory import loss_turn_bytes

ROWS, WIDTH, VOCAB = 64, 16, 256
LOGITS_BYTES = ROWS * VOCAB * 4


class HeadAndLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, x, labels):
        return nn.functional.cross_entropy(self.head(x), labels)


@pytest.fixture(scope="module")
def graph():
    with torch.device("meta"):
        model = HeadAndLoss()
        inputs = (torch.randn(ROWS, WIDTH), torch.zeros(ROWS, dtype=torch.long))
    return export_program(model, inputs).graph


def _config(output, inputs=(), options=()):
    return {"label": "x", "splits": {}, "inputs": [list(i) for i in inputs], "params": {},
            "output": list(output), "partial_axes": [], "grad_sync_axes": {}, "options": list(options)}


def _plan(graph, head_out, loss_in, options=()):
    names = {n.target.overloadpacket.__name__: n.name for n in graph.nodes
             if n.op == "call_function" and hasattr(n.target, "overloadpacket")}
    placements = {names["linear"]: _config(head_out, [["S(0)"]]),
                  names["cross_entropy_loss"]: _config(["R"], [loss_in, ["S(0)"]], options)}
    mesh = {"shape": [2], "levels": ["gpu"]}
    return ExecPlan.from_json({"id": "p", "mesh": mesh, "placements": placements})


def test_batch_split_logits_are_alive_once_at_the_forward_end_and_twice_in_backward(graph):
    forward, backward = loss_turn_bytes(graph, _plan(graph, ["S(0)"], ["S(0)"]))
    assert (forward, backward) == (LOGITS_BYTES // 2, LOGITS_BYTES)


def test_logits_laid_out_again_for_the_loss_count_their_copy(graph):
    # the head splits the vocabulary, the loss reads the batch split: both layouts alive at the loss
    forward, backward = loss_turn_bytes(graph, _plan(graph, ["S(1)"], ["S(0)"]))
    assert forward == LOGITS_BYTES  # half in the head's layout + half in the loss's
    assert backward == LOGITS_BYTES
    forward, backward = loss_turn_bytes(graph, _plan(graph, ["S(1)"], ["R"]))  # a replicated copy
    assert forward == LOGITS_BYTES // 2 + LOGITS_BYTES
    assert backward == 2 * LOGITS_BYTES


def test_a_chunked_loss_holds_no_whole_logits(graph):
    assert loss_turn_bytes(graph, _plan(graph, ["S(0)"], ["S(0)"], options=["chunked_loss"])) == (0, 0)
