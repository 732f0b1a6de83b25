"""Weights tied across pipeline stages, run: HF GPT-2's token embedding (stage 0) and LM head (the
last stage) share one parameter (``tie_word_embeddings``).

One launch of 2 gloo processes trains pp=2 under 1F1B and GPipe, and Interleaved1F1B (4 virtual
stages, the embedding on rank 0 and the head on rank 1). Each stage keeps a copy of the tied weight;
once per step the copies' gradients are summed between the two ranks
(:mod:`tensoropt.pipeline_runtime.tied`). Losses and final parameters must equal one process's within
1e-5, and the two copies must be equal after training (both took the same optimizer steps).
Without the sum each copy would step on its own use's gradient only: the copies drift apart and the
parameters differ from one process's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from pipeline_jobs import plan, tied_gpt2_spec

from tensoropt.launch import LaunchOptions, launch_module
from tensoropt.pipeline_runtime.reference import reference_run

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 3
RUNS = {"gpt2-tied-1f1b": ("1F1B", [[0, 1], [2, 3]], 2),
        "gpt2-tied-gpipe": ("GPipe", [[0, 1], [2, 3]], 4),
        "gpt2-tied-interleaved": ("Interleaved1F1B", [[0, 0], [1, 1], [2, 2], [3, 3]], 2)}


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    out = tmp_path_factory.mktemp("tied")
    spec = tied_gpt2_spec()
    runs = {}
    for name, (schedule, blocks, m) in RUNS.items():
        entry = plan(name, 2, schedule, blocks, m)
        entry["pipeline"]["stages"] = 2  # 2 ranks (Interleaved1F1B: 4 virtual stages in blocks)
        runs[name] = {"spec": spec.to_json(), "plan": entry, "steps": STEPS,
                      "metrics": str(out / f"{name}.json"), "params_dir": str(out / name)}
    path = out / "run.json"
    path.write_text(json.dumps({"runs": list(runs.values()), "timeout_s": 120}))
    code = launch_module("tensoropt.pipeline_runtime.worker", [str(path)], LaunchOptions(2, timeout_s=600))
    return code, runs


@pytest.fixture(scope="module")
def references():
    spec = tied_gpt2_spec()
    return {m: reference_run(spec, STEPS, m) for m in (2, 4)}


@pytest.mark.parametrize("name", list(RUNS))
def test_tied_embedding_and_head_on_two_stages_match_one_process(launched, references, name):
    code, runs = launched
    assert code == 0
    run = runs[name]
    ref_losses, ref_params = references[run["plan"]["pipeline"]["micro_batches"]]
    tied = [k for k in ref_params if k.endswith("wte.weight") or k.endswith("lm_head.weight")]
    assert len(tied) == 1, f"one process should name the tied weight once, got {tied}"
    metrics = json.loads(Path(run["metrics"]).read_text())
    assert metrics["losses"] == pytest.approx(ref_losses, rel=1e-5)
    stages = [torch.load(f) for f in sorted(Path(run["params_dir"]).glob("stage-*.pt"))]
    copies = [s[tied[0]] for s in stages if tied[0] in s]
    assert len(copies) == 2, f"{name}: the tied weight should be on both ranks, found {len(copies)}"
    assert torch.equal(copies[0], copies[1]), f"{name}: the two copies of the tied weight differ"
    params = {k: v for s in stages for k, v in s.items() if k in ref_params}
    assert set(params) == set(ref_params)
    for key, ref in ref_params.items():
        diff, scale = float((params[key] - ref).abs().max()), float(ref.abs().max())
        assert diff <= 1e-5 * scale, f"{name}: parameter {key} differs by {diff:.3g} (scale {scale:.3g})"
