"""Interleaved1F1B plans (two virtual stages per rank) trained by 2 torchrun workers (gloo) against
one process, fp32.

One launch of 2 processes runs pp=2 with 4 virtual stages (rank 0: stages 0 and 2, rank 1: 1 and
3) on HF Llama (4 layers) with m = 2 and m = 4 and on the zoo GPT (m = 2); the Llama m = 2 run
writes a DCP checkpoint, which one process (pp=1) resumes. Losses and final parameters must equal
the 1-process run's within 1e-5 (of each parameter's scale), and the resumed run must continue the
1-process run's losses.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pipeline_jobs import gpt_spec, launch_worlds, llama_spec, parity_errors, plan, run_entries, slices

from tensoropt.pipeline_runtime.reference import reference_run

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.timeout(900)]

STEPS, RESUMED_STEPS = 3, 2
LLAMA_VIRTUAL = [[0, 1], [2, 2], [3, 3], [4, 5]]
"""Embedding + layer 0 | layer 1 | layer 2 | layer 3 + head: rank 0 holds the first and third."""
GPT_VIRTUAL = [[0, 0], [1, 1], [2, 2], [3, 3]]


def _interleaved(plan_id: str, devices: int, blocks: list[list[int]], m: int) -> dict:
    entry = plan(plan_id, devices, "Interleaved1F1B", blocks, m)
    entry["pipeline"]["stages"] = len(blocks) // 2  # p ranks, 2 p virtual stages in blocks
    return entry


def _runs(out: Path, world: int) -> list[tuple[str, str, dict]]:
    specs = {"llama": llama_spec(), "gpt-fp32-momentum": gpt_spec("momentum")}
    if world == 2:
        chosen = [("llama-il-m2", "llama", _interleaved("llama-il-m2", 2, LLAMA_VIRTUAL, 2)),
                  ("llama-il-m4", "llama", _interleaved("llama-il-m4", 2, LLAMA_VIRTUAL, 4)),
                  ("gpt-il-m2", "gpt-fp32-momentum", _interleaved("gpt-il-m2", 2, GPT_VIRTUAL, 2))]
    else:
        chosen = [("llama-il-resumed", "llama", plan("llama-il-resumed", 1, "1F1B", [[0, 5]]))]
    return run_entries(out, chosen, specs, STEPS, "llama-il-m2", "llama-il-resumed", RESUMED_STEPS)


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    out = tmp_path_factory.mktemp("interleaved")
    codes, runs = launch_worlds(out, (2, 1), _runs)  # the 1-process run resumes the 2-process run's
    return out, codes, runs


@pytest.fixture(scope="module")
def references():
    """(losses, final parameters) of one process by (spec key, slices, steps)."""
    specs = {"llama": llama_spec(), "gpt-fp32-momentum": gpt_spec("momentum"), "llama-long": llama_spec()}
    wanted = [("llama", 2, STEPS), ("llama", 4, STEPS), ("llama", 1, STEPS), ("gpt-fp32-momentum", 2, STEPS),
              ("gpt-fp32-momentum", 1, STEPS), ("llama-long", 2, STEPS + RESUMED_STEPS)]
    return {w: reference_run(specs[w[0]], w[2], w[1]) for w in wanted}


@pytest.mark.parametrize("name", ["llama-il-m2", "llama-il-m4", "gpt-il-m2"])
def test_interleaved_four_virtual_stages_on_two_processes_match_one_process(launched, references, name):
    out, codes, runs = launched
    assert codes[2] == 0
    key, run = runs[name]
    errors = parity_errors(name, run, references[key, slices(run), STEPS])
    assert not errors, "\n".join(errors)
    metrics = json.loads(Path(run["metrics"]).read_text())
    assert metrics["losses"] == pytest.approx(references[key, 1, STEPS][0], rel=1e-5)
    assert metrics["stage_mode"] == "replay"
    # each rank ran two virtual stages: rank 0 the first and third, rank 1 the second and last
    assert metrics["pipeline"]["schedule"] == "Interleaved1F1B" and len(metrics["pipeline"]["blocks"]) == 4
    assert sorted(r["virtual_stages"] for r in metrics["measured"]["ranks"]) == [[0, 2], [1, 3]]


def test_an_interleaved_checkpoint_resumes_on_one_process(launched, references):
    """Written by the 2-process Llama Interleaved1F1B run after STEPS steps (each rank its two
    stages' keys, the model's names), read by one process holding every block."""
    out, codes, runs = launched
    _, run = runs["llama-il-resumed"]
    errors = parity_errors("llama-il-resumed", run, references["llama-long", 2, STEPS + RESUMED_STEPS],
                           first=STEPS)
    assert not errors, "\n".join(errors)
    assert codes[1] == 0
