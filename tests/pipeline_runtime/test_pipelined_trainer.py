"""A pipelined plan trained with the trainer keys through ``tensoropt run`` (issues 25 and 27).

The tiny zoo GPT (untied head: 4 pipeline blocks), planned with ``planner.pipeline`` (2 stages,
1F1B, 2 micro-batches) and run by ``tensoropt run --plan`` on 2 gloo processes with momentum SGD in
``no_decay`` groups, warmup + cosine, clipping that really clips (``max_grad_norm`` below the norms),
``metrics.jsonl`` every step and ``checkpoint.export``. The run stops at step 4 (``--steps 4``,
checkpoints every 2 steps) and a second ``tensoropt run`` resumes from step 4 to the job's 6 steps.
Every step's loss, learning rate and pre-clipping gradient norm must equal the plain 1-process loop's
(``torch.nn.utils.clip_grad_norm_`` on the whole model) within 1e-5, and the exported model its final
parameters. A pipelined HF Llama run's validation losses equal the 1-process model's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import safetensors.torch
import yaml
from pipeline_jobs import GPT, plan, plan_pipelined

from tensoropt.cli import main
from tensoropt.config import Job
from tensoropt.elastic import read_events
from tensoropt.executor.job.spec import TrainSpec
from tensoropt.launch import LaunchOptions, launch_module
from tensoropt.training.metrics import METRIC_KEYS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from trainer_reference import reference  # noqa: E402

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.timeout(900)]

STEPS, FIRST, MAX_NORM, TOL = 6, 4, 0.3, 1e-5
REPO = Path(__file__).resolve().parents[2]


def _job(tmp: Path) -> dict:
    training = {k: v for k, v in GPT["training"].items() if k not in ("optimizer", "learning_rate")}
    return {**GPT,
            "training": {**training, "steps": STEPS, "max_grad_norm": MAX_NORM},
            "optimizer": {"name": "momentum", "lr": 0.05, "momentum": 0.9, "weight_decay": 0.01,
                          "no_decay": ["bias", "ln"]},
            "lr_scheduler": {"warmup_steps": 2, "decay": "cosine", "decay_steps": 4, "min_lr_ratio": 0.1},
            "metrics": {"log_every": 1, "jsonl": str(tmp / "metrics.jsonl")},
            "checkpoint": {"export": str(tmp / "export")},
            "planner": {"pipeline": {"stages": [2], "schedules": ["1F1B"], "micro_batches": [2]}}}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pipelined-trainer")
    job = _job(tmp)
    job_path, plan_path = plan_pipelined(job, tmp)
    common = ["run", str(job_path), "--plan", str(plan_path), "--checkpoint-dir", str(tmp / "ckpt"),
              "--checkpoint-every", "2", "--timeout-s", "300"]
    codes = [main([*common, "--steps", str(FIRST)]), main(common)]
    return tmp, job, codes


def test_losses_rates_and_norms_equal_the_plain_loop(trained):
    tmp, job, codes = trained
    assert codes == [0, 0]
    lines = (tmp / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert all(list(r) == list(METRIC_KEYS) for r in records)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1)), "steps 1-4, then 5-6 resumed"
    expected = reference(Job.from_dict(job), 2, STEPS)
    errors = []
    for got, want in zip(records, expected):
        for key in ("loss", "lr", "grad_norm"):
            if abs(got[key] - want[key]) > TOL * abs(want[key]):
                errors.append(f"step {want['step']} {key}: {got[key]} against {want[key]}")
    assert not errors, "\n".join(errors)
    assert any(r["grad_norm"] > MAX_NORM for r in expected), "the test's clipping clips nothing"
    # every 2 steps, the newest 2 kept (--keep-checkpoints' default): step-2 deleted once step-6 was written
    assert sorted(p.name for p in (tmp / "ckpt").glob("step-*")) == ["step-4", "step-6"]
    starts = [(e["world_size"], e["start_step"], e["resumed_from"], e["total_steps"])
              for e in read_events(tmp / "ckpt")]
    assert starts == [(2, 0, None, FIRST), (2, FIRST, FIRST, STEPS)], starts  # one line per start


def test_the_exported_model_is_the_trained_one(trained):
    tmp, job, _ = trained
    final: dict = {}
    reference(Job.from_dict(job), 2, STEPS, final_state=final)
    exported = safetensors.torch.load_file(str(tmp / "export" / "model.safetensors"))
    assert set(exported) == set(final)
    for key, want in final.items():
        diff, scale = float((exported[key] - want).abs().max()), float(want.abs().max()) or 1.0
        assert diff <= TOL * scale, f"{key} differs by {diff:.3g} (scale {scale:.3g})"


LLAMA_VALIDATION = {"validation": {"data": {"factory": "tensoropt.training.data:random_tokens",
                                             "kwargs": {"num_samples": 16, "seq_len": 32, "vocab_size": 256,
                                                        "seed": 7}},
                                    "every": 2, "steps": 2}}


def test_validation_and_export_of_a_pipelined_hf_run_equal_the_plain_loop(tmp_path):
    """HF Llama (4 layers; its loss a token mean), pp=2 1F1B, 4 steps validated every 2: the
    held-out losses (the schedule's forward-only ``eval``) equal the 1-process model's; the exported
    folder loads with ``from_pretrained`` and its logits equal the 1-process trained model's."""
    data = yaml.safe_load((REPO / "configs/jobs/hf-llama.yaml").read_text())
    data["model"]["kwargs"]["num_hidden_layers"] = 4
    data["training"] = {**data["training"], "optimizer": "momentum", "learning_rate": 0.05, "steps": 4}
    data.update(devices=[2], metrics={"log_every": 1, "jsonl": str(tmp_path / "metrics.jsonl")},
                checkpoint={"export": str(tmp_path / "export")}, **LLAMA_VALIDATION)
    job = Job.from_dict(data)
    run = {"spec": TrainSpec.from_job(job).to_json(), "plan": plan("llama-val", 2, "1F1B", [[0, 2], [3, 5]]),
           "steps": 4, "job": job.to_dict(), "out_dir": str(tmp_path)}
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"runs": [run], "timeout_s": 120}))
    code = launch_module("tensoropt.training.pipelined", [str(path)], LaunchOptions(2, timeout_s=400))
    assert code == 0
    logged = [json.loads(line) for line in (tmp_path / "validation.jsonl").read_text().splitlines()]
    final: dict = {}
    expected = [r for r in reference(job, 2, 4, final_state=final) if "val_loss" in r]
    assert [r["step"] for r in logged] == [r["step"] for r in expected] == [2, 4]
    for got, want in zip(logged, expected):
        assert abs(got["loss"] - want["val_loss"]) <= TOL * abs(want["val_loss"]), (got, want)
    _assert_exported_logits(tmp_path / "export", final)


def _assert_exported_logits(folder: Path, final: dict) -> None:
    """``from_pretrained(folder)`` gives the logits of an HF model holding ``final`` (the 1-process
    trained state; a job wrapper's ``model.`` prefix dropped)."""
    import torch
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    trained = AutoModelForCausalLM.from_config(exported.config).eval()
    own = set(trained.state_dict())
    state = {k if k in own else k.removeprefix("model."): v for k, v in final.items()}
    missing, unexpected = trained.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    ids = torch.randint(0, exported.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got, want = exported(ids).logits, trained(ids).logits
        untrained = AutoModelForCausalLM.from_config(exported.config)(ids).logits
    assert float((got - want).abs().max()) <= TOL * float(want.abs().max())
    assert float((got - untrained).abs().max()) > 1e-3, \
        "the exported logits equal an untrained model's: the export wrote nothing trained"


def test_checkpoints_resume_across_pipelined_and_unpipelined_plans(trained):
    """The pipelined run's step-4 checkpoint resumes under a plan without stages (2 processes,
    ``tensoropt run``'s loop) to step 6; the loop's own step-4 checkpoint resumes under the
    pipelined plan. Both continue the 1-process run's losses, rates and norms within 1e-5."""
    import shutil

    from tensoropt.planner import plan_job
    from tensoropt.plans import plan_file_text

    tmp, job, _ = trained
    expected = reference(Job.from_dict(job), 2, STEPS)
    flat = {**job, "planner": {"pipeline": "off"}, "checkpoint": {}}
    frontier = plan_job(Job.from_dict(flat)).to_json()
    unpipelined = tmp / "flat-plan.json"
    texts = [plan_file_text(frontier, p["id"]) for p in frontier["frontiers"][0]["plans"]]

    def splits_a_weight(text: str) -> bool:  # some operator split other than by batch: model-parallel
        labels = json.loads(text)["ops"].values()
        return any("=" in label and not label.startswith("batch=") for label in labels)

    model_parallel = [t for t in texts if splits_a_weight(t)]
    assert model_parallel, "the 2-device frontier has no model-parallel plan to resume under"
    unpipelined.write_text(model_parallel[0])
    pipelined = tmp / "plan.json"
    legs = {"from-pipelined": [(None, None)], "from-loop": [(unpipelined, FIRST)]}
    shutil.copytree(tmp / "ckpt" / f"step-{FIRST}", tmp / "from-pipelined" / f"step-{FIRST}")
    errors = []
    for name, first_legs in legs.items():
        folder = tmp / name
        folder.mkdir(exist_ok=True)
        metrics = folder / "metrics.jsonl"
        job_path = folder / "job.yaml"
        job_path.write_text(yaml.safe_dump({**flat, "metrics": {"log_every": 1, "jsonl": str(metrics)}}))
        resumed_plan = unpipelined if name == "from-pipelined" else pipelined
        runs = [(p, s) for p, s in first_legs if p is not None] + [(resumed_plan, None)]
        for plan_path, steps in runs:
            args = ["run", str(job_path), "--plan", str(plan_path), "--checkpoint-dir", str(folder / "ckpt"
                    if name == "from-loop" else folder), "--checkpoint-every", "2", "--timeout-s", "300"]
            assert main([*args, *(["--steps", str(steps)] if steps else [])]) == 0, (name, plan_path)
        records = {r["step"]: r for r in map(json.loads, metrics.read_text().splitlines())}
        assert min(records) <= FIRST + 1 and max(records) == STEPS, (name, sorted(records))
        for want in expected[FIRST:]:
            got = records[want["step"]]
            for key in ("loss", "lr", "grad_norm"):
                if abs(got[key] - want[key]) > TOL * abs(want[key]):
                    errors.append(f"{name} step {want['step']} {key}: {got[key]} against {want[key]}")
    assert not errors, "\n".join(errors)
