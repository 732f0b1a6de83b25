"""Memory options in the configuration space (issue 10): which variants exist and their layouts."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from tensoropt.capture import capture
from tensoropt.configspace import configurations
from tensoropt.configspace.configuration import Mesh, parse_label
from tensoropt.configspace.options import (
    base_configuration,
    check_options,
    compute_params,
    state_layout,
    state_layouts,
    with_options,
    zero_layout,
)


class TiedLM(nn.Module):
    """Embedding tied to the LM head, a norm and an MLP between (tied weights: never zero3)."""

    def __init__(self, vocab=16, d=8):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.ln = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 2 * d)
        self.out = nn.Linear(2 * d, d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx, y):
        h = self.out(torch.relu(self.fc(self.ln(self.tok(idx)))))
        return nn.functional.cross_entropy(self.head(h).flatten(0, 1), y.flatten())


@pytest.fixture(scope="module")
def graph():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return capture(TiedLM(), (torch.randint(0, 16, (4, 6)), torch.randint(0, 16, (4, 6))))


MESH = Mesh.for_cluster(4, 4)


def test_no_options_is_the_plain_space(graph):
    plain = configurations(graph, MESH)
    assert with_options(graph, plain, MESH, []) is plain
    assert all(not c.options for confs in plain.values() for c in confs)


def test_zero3_variants_shard_parameters_over_their_gradient_sync_axes(graph):
    plain = configurations(graph, MESH)
    opts = with_options(graph, plain, MESH, ["zero3"])
    g = graph.nx
    tied = {k for n in g for k in g.nodes[n]["shared_params"]}
    assert tied, "the test model must tie a parameter"
    seen = 0
    for node, confs in opts.items():
        labels = [c.label for c in confs]
        assert len(set(labels)) == len(labels)
        for c in confs:
            if "zero3" not in c.options:
                continue
            seen += 1
            assert not set(g.nodes[node]["params"]) & tied
            base = base_configuration(c)
            assert base in plain[node] and c.label == base.label + ",zero3"
            assert parse_label(c.label) == parse_label(base.label)
            sync = dict(c.grad_sync_axes)
            assert sync, c.label
            for key, stored in c.params:
                computed = dict(base.params)[key]
                for axis, (s, p) in enumerate(zip(stored, computed)):
                    if axis in sync.get(key, ()):
                        assert p == "R" and s.startswith("S("), (node, c.label, key, stored)
                    else:
                        assert s == p
            assert compute_params(c) == base.params
        # every plain configuration with gradient-sync axes and untied parameters has its zero3 variant
        for c in plain[node]:
            has = any(x.label == c.label + ",zero3" for x in confs)
            assert has == bool(c.grad_sync_axes and not set(g.nodes[node]["params"]) & tied), (node, c.label)
    assert seen >= 4


def test_recompute_only_where_allowed_and_never_with_a_partial_sum(graph):
    plain = configurations(graph, MESH)
    allowed = {"relu", "layer_norm"}
    opts = with_options(graph, plain, MESH, ["recompute", "zero3"], recomputable=lambda n: n in allowed)
    for node, confs in opts.items():
        rec = [c for c in confs if "recompute" in c.options]
        if node not in allowed:
            assert not rec
            continue
        assert rec and all(not c.partial_axes for c in rec)
        without_partial = {c.label for c in plain[node] if not c.partial_axes}
        assert {base_configuration(c).label for c in rec} == without_partial
    both = [c.label for c in opts["layer_norm"] if len(c.options) == 2]
    assert both and all(label.endswith(",zero3,recompute") for label in both)


def test_zero_layout_needs_an_evenly_divisible_dim():
    mesh = Mesh((2, 3), ("gpu", "gpu"))
    assert zero_layout(("R", "R"), (3, 4), (0,), mesh) == ("S(1)", "R")
    assert zero_layout(("R", "S(0)"), (6,), (0,), mesh) == ("S(0)", "S(0)")
    assert zero_layout(("R", "R"), (5, 7), (0,), mesh) is None


def test_unknown_option_is_named():
    with pytest.raises(ValueError, match="zero4"):
        check_options(["recompute", "zero2", "zero4"])
    assert check_options(["zero1", "zero2", "zero3", "recompute"]) == ("zero1", "zero2", "zero3", "recompute")


def test_zero1_zero2_variants_are_exclusive_and_combine_with_recompute(graph):
    plain = configurations(graph, MESH)
    everything = ["recompute", "zero1", "zero2", "zero3"]
    opts = with_options(graph, plain, MESH, everything, recomputable=lambda n: True)
    g = graph.nx
    tied = {k for n in g for k in g.nodes[n]["shared_params"]}
    counts = {"zero1": 0, "zero2": 0}
    for node, confs in opts.items():
        params = g.nodes[node]["params"]
        labels = [c.label for c in confs]
        assert len(set(labels)) == len(labels)
        for c in confs:
            zeros = [o for o in c.options if o.startswith("zero")]
            assert len(zeros) <= 1, c.label  # mutually exclusive
            if zeros and zeros[0] in counts:
                counts[zeros[0]] += 1
                base = base_configuration(c)
                assert c.params == base.params  # parameters keep their compute layout
                assert c.label == ",".join([base.label, *c.options])
                assert not set(params) & tied
                layouts = state_layouts(c, params, MESH)
                sync = dict(c.grad_sync_axes)
                assert layouts and set(layouts) <= set(sync)
                for key, lay in layouts.items():
                    computed = dict(c.params)[key]
                    assert [a for a, (x, y) in enumerate(zip(lay, computed)) if x != y] == list(sync[key])
        for c in plain[node]:
            for z in ("zero1", "zero2"):
                offered = c.label + "," + z in labels
                assert offered == bool(c.grad_sync_axes and not set(params) & tied
                                       and state_layouts(dict_replace(c, z), params, MESH)), (node, c.label)
                if offered and c.label + ",recompute" in labels:
                    assert c.label + "," + z + ",recompute" in labels
    assert counts["zero1"] == counts["zero2"] >= 4
    assert not state_layouts(base_configuration(confs[0]), params, MESH)  # no zero option: nothing


def dict_replace(c, option):
    import dataclasses

    return dataclasses.replace(c, options=(option,))


def test_state_layout_slices_the_local_parameter():
    mesh = Mesh((2, 3), ("gpu", "gpu"))
    assert state_layout(("R", "S(0)"), (6, 4), (0,), mesh) == ("S(1)", "S(0)")  # dim 0 taken by axis 1
    assert state_layout(("R", "R"), (3, 4), (0,), mesh) == ("S(1)", "R")
    assert state_layout(("R", "R"), (6, 4), (0, 1), mesh) == ("S(0)", "S(0)")
    assert state_layout(("R", "S(0)"), (6,), (0,), mesh) is None
