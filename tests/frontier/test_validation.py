"""Bad input raises ValueError naming the node or edge and the fix."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

import frontier


def _graph():
    G = nx.DiGraph()
    G.add_node("conv1", cost=np.ones((2, 2)))
    G.add_node("fc", cost=np.ones((3, 2)))
    G.add_edge("conv1", "fc", cost=np.zeros((2, 3, 2)))
    return G


def test_valid_graph_solves():
    assert len(frontier.solve(_graph())) == 1


@pytest.mark.parametrize(
    "mutate, pattern",
    [
        (lambda G: G.nodes["fc"].update(cost=np.ones(3)), r"node 'fc'.*shape \(3,\)"),
        (lambda G: G.nodes["fc"].update(cost=np.ones((0, 2))), r"node 'fc'.*0 configurations"),
        (lambda G: G.nodes["fc"].update(cost=np.ones((3, 3))), r"node 'fc'.*3 objectives"),
        (lambda G: G.nodes["fc"].pop("cost"), r"node 'fc' has no \"cost\""),
        (lambda G: G.nodes["fc"].update(cost=np.array([[1, np.nan]] * 3)), r"node 'fc'.*NaN"),
        (lambda G: G.nodes["fc"].update(cost=np.full((3, 2), np.inf)), r"node 'fc'.*infinite"),
        (lambda G: G.nodes["fc"].update(cost=[["a", "b"]] * 3), r"node 'fc'.*not a numeric"),
        (
            lambda G: G.edges["conv1", "fc"].update(cost=np.zeros((3, 2, 2))),
            r"edge \('conv1', 'fc'\).*\(2, 3, 2\)",
        ),
        (
            lambda G: G.edges["conv1", "fc"].update(cost=np.full((2, 3, 2), -np.inf)),
            r"edge \('conv1', 'fc'\).*-inf",
        ),
        (lambda G: G.edges["conv1", "fc"].pop("cost"), r"edge \('conv1', 'fc'\) has no"),
        (lambda G: G.add_edge("fc", "conv1", cost=np.zeros((3, 2, 2))), r"cycle.*'conv1'.*'fc'"),
    ],
)
def test_bad_input_names_the_culprit(mutate, pattern):
    G = _graph()
    mutate(G)
    with pytest.raises(ValueError, match=pattern):
        frontier.solve(G)


def test_other_bad_calls():
    with pytest.raises(ValueError, match="no nodes"):
        frontier.solve(nx.DiGraph())
    with pytest.raises(ValueError, match="DiGraph"):
        frontier.solve(nx.MultiDiGraph(_graph()))
    with pytest.raises(ValueError, match="epsilon"):
        frontier.solve(_graph(), epsilon=-0.1)
    G = _graph()
    G.nodes["fc"]["cost"] = -np.ones((3, 2))
    with pytest.raises(ValueError, match=r"node 'fc'.*negative cost"):
        frontier.solve(G, epsilon=0.1)
    assert len(frontier.solve(G)) == 1  # negative costs are fine when exact


def test_infinite_configuration_is_never_chosen():
    G = _graph()
    G.nodes["fc"]["cost"] = np.array([[0.0, 0.0], [np.inf, 0.0], [5.0, 5.0]])
    (p,) = frontier.solve(G)
    assert p.assignment["fc"] == 0 and np.isfinite(p.cost).all()
