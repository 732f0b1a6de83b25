"""examples/train_loop.py (the loop of issue 24) runs under torchrun on 2 processes: a model built on
meta from the plan's job, trained in the user's loop, written by save_model and read back by
``from_pretrained``; then fine-tuned from that directory (real weights) the same way."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the HuggingFace tests need the dev extra (transformers 5.x)")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "parallel"))
from loop_plans import pick_plan  # noqa: E402
from torchrun import torchrun  # noqa: E402


def _torchrun(args: list[str], timeout_s: float = 400):
    return torchrun(ROOT / "examples" / "train_loop.py", args, timeout_s)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_example_train_loop_trains_saves_and_fine_tunes(tmp_path):
    from transformers import AutoModelForCausalLM

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(pick_plan("gpt2", 4, "model_parallel")))
    proc = _torchrun([str(plan), "--steps", "3", "--out", str(tmp_path / "model")])
    assert proc.returncode == 0, proc.stderr[-4000:]
    losses = [float(x) for x in re.findall(r"step \d+: loss ([0-9.]+)", proc.stdout)]
    assert len(losses) == 3 and all(5.0 < x < 6.5 for x in losses), proc.stdout  # ln(256) = 5.5 at the start
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    assert model.config.n_layer == 2
    proc = _torchrun([str(plan), "--steps", "2", "--pretrained", str(tmp_path / "model"),
                      "--out", str(tmp_path / "tuned")])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (tmp_path / "tuned" / "model.safetensors").exists() and "saved" in proc.stdout
