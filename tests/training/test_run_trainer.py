"""``tensoropt run`` with the trainer's keys (configs/jobs/hf-gpt2-train.yaml, shortened): 2 processes,
the planned micro-batches, metrics.jsonl every log_every steps with the contract's keys, validation
lines, TensorBoard events and the exported model that transformers reads back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

pytest.importorskip("transformers", reason="the HuggingFace tests need the dev extra (transformers 5.x)")
pytestmark = [pytest.mark.distributed, pytest.mark.timeout(1200)]

from tensoropt import cli  # noqa: E402
from tensoropt.training.metrics import METRIC_KEYS, VALIDATION_KEYS  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def test_run_trains_with_every_trainer_key(tmp_path, capsys):
    job = yaml.safe_load((REPO / "configs" / "jobs" / "hf-gpt2-train.yaml").read_text())
    job["training"].update(steps=6, micro_batches=2)
    job["lr_scheduler"].update(warmup_steps=2, decay_steps=4)
    job["metrics"] = {"log_every": 2, "jsonl": str(tmp_path / "m" / "metrics.jsonl"),
                      "tensorboard": str(tmp_path / "tb")}
    job["validation"].update(every=3, steps=1)
    job["checkpoint"] = {"export": str(tmp_path / "model")}
    job["devices"] = [2]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    assert cli.main(["plan", str(path), "--out", str(tmp_path), "--no-plot", "--quiet"]) == 0
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["micro_batches"] == 2
    rc = cli.main(["run", str(path), "--plan", str(tmp_path / "plan.json"), "--nproc", "2",
                   "--timeout-s", "600"])
    out = capsys.readouterr()
    assert rc == 0, out.err[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 4, 6] and all(list(r) == list(METRIC_KEYS) for r in rows)
    assert all(r["loss"] > 0 and r["grad_norm"] > 0 and r["tokens_per_s"] > 0 for r in rows)
    val = [json.loads(line) for line in (tmp_path / "m" / "validation.jsonl").read_text().splitlines()]
    assert [v["step"] for v in val] == [3, 6] and all(list(v) == list(VALIDATION_KEYS) for v in val)
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(tmp_path / "model")
    assert model.config.n_layer == 2
