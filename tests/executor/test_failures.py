"""An error on one rank ends every rank promptly, with the error shown; a wrong plan is named."""

from __future__ import annotations

import copy
import time

import pytest
from hand_plans import SPECS, cfg, mlp_plans
from launch_helpers import run_plans

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(240)]


def test_error_on_one_rank_ends_all_ranks_promptly(tmp_path, capfd):
    plan = mlp_plans(2)[0]
    start = time.perf_counter()
    # rank 1 fails at step 1 while rank 0 is already in that step's collectives
    # collectives would time out only after 600 s: ending sooner means rank 0 was stopped, not timed out
    rc, _ = run_plans([("mlp", SPECS["mlp"], plan)], 2, tmp_path, timeout_s=200,
                      env={"TENSOROPT_COLLECTIVE_TIMEOUT_S": "600"}, fail_at={"rank": 1, "step": 1})
    seconds = time.perf_counter() - start
    err = capfd.readouterr().err
    assert rc != 0
    assert "rank 1 failed" in err and "injected failure at step 1" in err, err[-3000:]
    assert seconds < 120, f"the launch took {seconds:.0f} s to end after a rank failed"
    assert not (tmp_path / f"mlp-{plan['id']}.json").exists()


def test_wrong_plan_is_an_error_naming_the_node(tmp_path, capfd):
    plan = copy.deepcopy(mlp_plans(2)[1])  # Megatron: linear_1 reduces its partial sums itself
    plan["id"] = "mlp-tp-wrong"
    # claim linear_1's output is complete (no partial axes): DTensor really produces a partial sum
    plan["placements"]["linear_1"] = cfg([["S(1)"]], ["R"], [("fc2.weight", ["S(1)"]), ("fc2.bias", ["R"])])
    rc, _ = run_plans([("mlp", SPECS["mlp"], plan)], 2, tmp_path, timeout_s=200)
    err = capfd.readouterr().err
    assert rc != 0
    assert "PlacementMismatch: node 'linear_1' (aten.linear.default" in err, err[-3000:]
    assert "expected output placement ('R',), DTensor produced ('P',)" in err, err[-3000:]
