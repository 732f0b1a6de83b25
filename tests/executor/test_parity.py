"""Parity, the executor's core test: every plan trains like the single-device model.

For the MLP, the small CNN (conv + BN + pool + fc) and the small GPT, hand-written plans (data,
tensor, conv-channel and mixed parallelism) and plans spread along the real planner's 2- and
4-device frontiers train 3 steps at 2 and 4 processes (gloo, CPU); losses and final parameters
must equal the 1-process run's within 1e-5 relative. All plans of one world size share one
torchrun launch (one process group), to keep the test fast.
"""

from __future__ import annotations

import functools
import json

import pytest
from frontier_plans import frontier_runs
from hand_plans import SPECS, all_plans
from launch_helpers import parity_errors, run_plans, single_process

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

MODELS = ("mlp", "cnn", "gpt")
PER_FRONTIER = {2: 10, 4: 8}
"""Plans per frontier: all when there are this many or fewer, else this many spread, ends included."""


@functools.cache
def _runs(nproc: int):
    hand = [(name, SPECS[name], plan) for name, plan in all_plans(nproc)]
    return hand + frontier_runs(nproc, PER_FRONTIER[nproc])


@pytest.fixture(scope="module")
def references():
    refs = {}
    for nproc in PER_FRONTIER:
        for _, spec, _ in _runs(nproc):
            key = json.dumps(spec.to_json(), sort_keys=True)
            if key not in refs:
                refs[key] = single_process(spec)
    return refs


@pytest.fixture(scope="module", params=[2, pytest.param(4, marks=pytest.mark.slow)], ids=["2proc", "4proc"])
def launched(request, tmp_path_factory):
    nproc = request.param
    out = tmp_path_factory.mktemp(f"parity{nproc}")
    runs = _runs(nproc)
    rc, seconds = run_plans(runs, nproc, out)
    print(f"{len(runs)} plans at {nproc} processes in {seconds:.1f} s")
    return nproc, out, runs, rc


@pytest.mark.parametrize("model", MODELS)
def test_plans_match_single_process(launched, references, model):
    nproc, out, runs, rc = launched
    mine = [(name, spec, plan) for name, spec, plan in runs if name == model]
    assert len(mine) >= 3, f"too few {model} plans at {nproc} processes: {[p['id'] for _, _, p in mine]}"
    errors = []
    for name, spec, plan in mine:
        errors += parity_errors(name, plan["id"], out, references[json.dumps(spec.to_json(), sort_keys=True)])
    assert rc == 0 or errors, f"the launch failed (exit {rc}) although every {model} plan has outputs"
    assert not errors, "\n".join(errors)


def test_frontier_extremes_included():
    runs = _runs(2)
    for model in MODELS:
        ids = [p["id"] for name, _, p in runs if name == model and p["id"].startswith("d2-")]
        assert ids[0] == "d2-p0", ids
        assert len(ids) >= min(PER_FRONTIER[2], 3)
