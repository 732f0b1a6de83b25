"""Redistribution: free between identical layouts, the COSTS.md table, backward, changing sizes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from estimators.collectives import CommModel
from estimators.profiles import load_cluster
from estimators.redistribution import (
    edge_time_s,
    gradient_layout,
    redistribution_steps,
    redistribution_time_s,
    through_view,
)
from tensoropt.configspace.configuration import Mesh

MESH = Mesh((2, 2, 2), ("node", "gpu", "gpu"))
CM = CommModel(load_cluster("h100-4x8-ib"), MESH)
placement = st.sampled_from(["R", "S(0)", "S(1)", "S(2)"])
layout = st.tuples(placement, placement, placement)


@settings(max_examples=150, deadline=None)
@given(layout, st.tuples(st.integers(1, 64), st.integers(1, 64), st.integers(1, 64)))
def test_identical_layouts_cost_nothing_either_way(lay, shape):
    assert redistribution_time_s(CM, shape, 4, lay, lay) == 0.0
    assert edge_time_s(CM, shape, 4, lay, lay, frozenset(), True) == (0.0, 0.0)


@settings(max_examples=150, deadline=None)
@given(layout, layout)
def test_costs_are_nonnegative_and_slicing_is_free(src, dst):
    shape = (16, 16, 16)
    assert redistribution_time_s(CM, shape, 4, src, dst) >= 0.0
    if all(s == d or s == "R" for s, d in zip(src, dst)):
        assert redistribution_time_s(CM, shape, 4, src, dst) == 0.0


def test_table_forward_collectives():
    m = (2,)
    assert redistribution_steps((8, 8), 4, ("S(0)",), ("R",), m) == [("all_gather", 256, 0)]
    assert redistribution_steps((8, 8), 4, ("P",), ("R",), m) == [("all_reduce", 256, 0)]
    assert redistribution_steps((8, 8), 4, ("P",), ("S(1)",), m) == [("reduce_scatter", 256, 0)]
    assert redistribution_steps((8, 8), 4, ("S(0)",), ("S(1)",), m) == [("all_to_all", 128.0, 0)]
    assert redistribution_steps((8, 8), 4, ("R",), ("S(1)",), m) == []


def test_sizes_follow_earlier_transitions():
    # gathering axis 0 then axis 1: the second gather moves the bigger tensor
    steps = redistribution_steps((16, 16), 4, ("S(0)", "S(1)"), ("R", "R"), (2, 2))
    assert steps == [("all_gather", 512, 0), ("all_gather", 1024, 1)]
    # a free slice first shrinks what the later gather moves
    steps = redistribution_steps((16, 16), 4, ("R", "S(1)"), ("S(0)", "R"), (2, 2))
    assert steps == [("all_gather", 512, 1)]


def test_backward_depends_on_what_the_consumer_split():
    cm = CommModel(load_cluster("h100x8"), Mesh((2,), ("gpu",)))
    shape = (64, 64)
    # S -> R consumed by a replicated op: gradient is replicated, slicing it back is free
    assert edge_time_s(cm, shape, 4, ("S(0)",), ("R",), frozenset(), True)[1] == 0.0
    # S -> R consumed by a column-split op: partial gradient, reduce-scatter back
    fwd, bwd = edge_time_s(cm, shape, 4, ("S(0)",), ("R",), frozenset({0}), True)
    assert bwd == pytest.approx(cm.time_s("reduce_scatter", 64 * 64 * 4, (0,)))
    # R -> S: free forward, all-gather backward
    fwd, bwd = edge_time_s(cm, shape, 4, ("R",), ("S(1)",), frozenset({0}), True)
    assert fwd == 0.0 and bwd == pytest.approx(cm.time_s("all_gather", 64 * 64 * 4, (0,)))
    # R -> R under a column split (Megatron f): all-reduce backward only; none without grad
    assert edge_time_s(cm, shape, 4, ("R",), ("R",), frozenset({0}), True)[1] == pytest.approx(
        cm.time_s("all_reduce", 64 * 64 * 4, (0,))
    )
    assert edge_time_s(cm, shape, 4, ("R",), ("R",), frozenset({0}), False) == (0.0, 0.0)
    assert gradient_layout(("R", "S(1)", "R"), {0, 1}) == ("P", "S(1)", "R")


def test_slow_level_transition_costs_more():
    shape = (256, 256, 256)
    on_node_axis = redistribution_time_s(CM, shape, 4, ("S(0)", "R", "R"), ("R", "R", "R"))
    on_gpu_axis = redistribution_time_s(CM, shape, 4, ("R", "S(0)", "R"), ("R", "R", "R"))
    assert on_node_axis > on_gpu_axis > 0


def test_views_that_mix_a_sharded_dim_force_a_gather():
    assert through_view(("S(1)", "S(0)"), [0, None, 1]) == (("R", "S(0)"), ("R", "S(0)"))
    with pytest.raises(ValueError, match="invalid"):
        redistribution_steps((4,), 4, ("S(3)",), ("R",), (2,))
