"""Pipeline stages compiled by Inductor (``executor.compile: inductor``) on 2 gloo processes.

One launch (pp = 2, 1F1B, 2 micro-batches, the tiny zoo GPT, momentum SGD in fp32) runs the plan
with its stages replayed uncompiled, then compiled (writing a checkpoint), then compiled again from
that checkpoint for one more step. Every run's losses and final parameters must equal one process's
within 1e-5 (relative to the loss, and to each parameter's largest magnitude), the bound the
compiled program without a pipeline is held to (tests/executor/test_replay.py): Inductor fuses and
reorders float sums, which moves fp32 results by rounding (~1e-7 relative here, docs/results.md),
and momentum SGD does not amplify that as AdamW does on this model's zero-gradient key biases
(``pipeline_jobs.gpt_spec``). Inductor's cache is a fresh folder, so the test pays the cold
compilation, as a first run on a new machine does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from pipeline_jobs import gpt_spec, launch_worlds, parity_errors, plan, run_entries

from tensoropt.pipeline_runtime.reference import reference_run

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.timeout(600)]

STEPS, RESUMED = 2, 1
BLOCKS = [[0, 1], [2, 3]]


def _runs(out: Path, world: int) -> list[tuple[str, str, dict]]:
    names = ("plain", "inductor", "inductor-resumed")
    chosen = [(name, "gpt", plan(name, 2, "1F1B", BLOCKS)) for name in names]
    runs = run_entries(out, chosen, {"gpt": gpt_spec("momentum")}, STEPS, "inductor", "inductor-resumed",
                       RESUMED)
    for name, _, run in runs:
        run["compile"] = "inductor" if name.startswith("inductor") else "none"
    return runs


def test_compiled_stages_train_as_the_uncompiled_ones_and_one_process(tmp_path, monkeypatch):
    pytest.importorskip("torch._inductor")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-cache"))
    codes, runs = launch_worlds(tmp_path, (2,), _runs)
    assert codes[2] == 0
    spec = gpt_spec("momentum")
    reference = reference_run(spec, STEPS, 2)
    longer = reference_run(spec, STEPS + RESUMED, 2)
    errors = parity_errors("plain", runs["plain"][1], reference)
    errors += parity_errors("inductor", runs["inductor"][1], reference)
    errors += parity_errors("inductor-resumed", runs["inductor-resumed"][1], longer, first=STEPS)
    plain_params = {k: v for f in sorted(Path(runs["plain"][1]["params_dir"]).glob("stage-*.pt"))
                    for k, v in torch.load(f).items() if k in reference[1]}  # parameters, not buffers
    plain_losses = json.loads(Path(runs["plain"][1]["metrics"]).read_text())["losses"]
    errors += parity_errors("inductor against plain", runs["inductor"][1], (plain_losses, plain_params))
    assert not errors, "\n".join(errors)
    metrics = {name: json.loads(Path(run["metrics"]).read_text()) for name, (_, run) in runs.items()}
    for name, m in metrics.items():
        compiled = name.startswith("inductor")
        assert m["stage_mode"] == "replay" and m["stage_compile"] == ("inductor" if compiled else "none")
        assert all((r["compile_s"] > 0) == compiled for r in m["measured"]["ranks"]), m["measured"]["ranks"]
