"""The tiny models the pipelined runtime is checked on: the zoo GPT (untied) and HF Llama (4 layers)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
import yaml

from tensoropt.config import Job
from tensoropt.executor.job.spec import TrainSpec
from tensoropt.launch import LaunchOptions, launch_module

ROOT = Path(__file__).resolve().parents[2]

GPT = {"model": {"name": "gpt", "kwargs": {"layers": 2, "width": 32, "heads": 2, "seq_len": 8,
                                           "vocab_size": 64, "dropout": 0.0, "tie_weights": False}},
       "cluster": "cpu-local", "devices": [2],
       "training": {"global_batch_size": 8, "optimizer": "adamw", "learning_rate": 0.01, "seed": 0}}
"""Zoo GPT: embedding, 2 blocks, head (4 pipeline blocks); the head untied (tied weights across
stages are not run yet)."""


def gpt_spec(optimizer: str = "adamw", dtype: str = "float32") -> TrainSpec:
    """The tiny GPT's spec. Its attention key biases have an exactly-zero gradient (softmax ignores
    a constant added to every key's score), which AdamW's normalisation turns from rounding noise
    into lr-sized steps: fp32 AdamW cannot match 1 process there, whatever the runtime. fp32 parity
    is checked with momentum SGD (as tests/executor/test_zoo_parity.py does), AdamW in float64."""
    job = Job.from_dict({**GPT, "training": {**GPT["training"], "optimizer": optimizer}})
    return dataclasses.replace(TrainSpec.from_job(job), dtype=dtype)


def llama_spec(layers: int = 4, dtype: str = "float32") -> TrainSpec:
    """configs/jobs/hf-llama.yaml with ``num_hidden_layers`` 4 (embedding, 4 layers, head: 6 blocks)."""
    data = yaml.safe_load((ROOT / "configs/jobs/hf-llama.yaml").read_text())
    data["model"]["kwargs"]["num_hidden_layers"] = layers
    return dataclasses.replace(TrainSpec.from_job(Job.from_dict(data)), dtype=dtype)


def padded_llama_spec(layers: int = 4) -> TrainSpec:
    """:func:`llama_spec` on padded sequences (``random_tokens(max_padding=24)``: each sample's last
    0..24 of 32 labels are -100), so micro-batches hold different numbers of counted tokens; momentum
    SGD (fp32 AdamW would amplify the rounding of another summation order, see :func:`gpt_spec`)."""
    data = yaml.safe_load((ROOT / "configs/jobs/hf-llama.yaml").read_text())
    data["model"]["kwargs"]["num_hidden_layers"] = layers
    data["training"]["optimizer"] = "momentum"
    data["data"] = {"factory": "tensoropt.training.data:random_tokens",
                    "kwargs": {"num_samples": 64, "seq_len": 32, "vocab_size": 256, "seed": 3,
                               "max_padding": 24}}
    return TrainSpec.from_job(Job.from_dict(data))


def plan(plan_id: str, devices: int, schedule: str, blocks: list[list[int]], micro_batches: int = 2) -> dict:
    """A plan entry with the contract's ``"pipeline"`` (what the runtime reads of a plan.json)."""
    return {"id": plan_id, "devices": devices,
            "pipeline": {"stages": len(blocks), "schedule": schedule, "micro_batches": micro_batches,
                         "blocks": blocks}}


def plan_pipelined(job: dict, out: Path) -> tuple[Path, Path]:
    """Write ``job`` as ``out/job.yaml``, plan it (its ``planner.pipeline``) and write the first
    pipelined plan of its frontier as ``out/plan.json``; returns both paths (what ``tensoropt run
    JOB --plan PLAN`` takes)."""
    from tensoropt.planner import plan_job
    from tensoropt.plans import plan_file_text

    job_path = out / "job.yaml"
    job_path.write_text(yaml.safe_dump(job))
    frontier = plan_job(Job.from_dict(job)).to_json()
    pipelined = [p["id"] for f in frontier["frontiers"] for p in f["plans"] if p.get("pipeline")]
    assert pipelined, "the planner listed no pipelined plan"
    plan_path = out / "plan.json"
    plan_path.write_text(plan_file_text(frontier, pipelined[0]))
    return job_path, plan_path


def tied_gpt2_spec(optimizer: str = "momentum") -> TrainSpec:
    """configs/jobs/hf-gpt2.yaml (HF GPT-2, 2 layers: embedding, 2 blocks, head), its token embedding
    tied to the LM head (``tie_word_embeddings``, GPT-2's default), trained by momentum SGD in fp32
    (its attention key biases have an exactly-zero gradient that AdamW would amplify, see
    :func:`gpt_spec`)."""
    data = yaml.safe_load((ROOT / "configs/jobs/hf-gpt2.yaml").read_text())
    data["model"]["kwargs"]["tie_word_embeddings"] = True
    data["training"]["optimizer"] = optimizer
    return TrainSpec.from_job(Job.from_dict(data))


def run_entries(out: Path, chosen: list[tuple[str, str, dict]], specs: dict, steps: int,
                checkpointed: str, resumed: str, resumed_steps: int) -> list[tuple[str, str, dict]]:
    """(name, spec key, worker run entry) of each chosen (name, spec key, plan): run ``checkpointed``
    writes ``out/<checkpointed>-ckpt``, which run ``resumed`` resumes for ``resumed_steps``; a name
    ending in ``-eager`` runs without replay."""
    runs = []
    for name, key, entry in chosen:
        run = {"spec": specs[key].to_json(), "plan": entry, "steps": steps,
               "metrics": str(out / f"{name}.json"), "params_dir": str(out / name)}
        if name.endswith("-eager"):
            run["replay"] = False
        if name == checkpointed:
            run["checkpoint_dir"] = str(out / f"{checkpointed}-ckpt")
        if name == resumed:
            run.update(steps=resumed_steps, resume_from=str(out / f"{checkpointed}-ckpt"))
        runs.append((name, key, run))
    return runs


def launch_worlds(out: Path, worlds: tuple[int, ...], runs_of_world) -> tuple[dict, dict]:
    """One worker launch per world size, in order (``runs_of_world(out, world)`` gives its runs):
    (exit code by world, (spec key, run entry) by run name)."""
    codes, runs = {}, {}
    for world in worlds:
        chosen = runs_of_world(out, world)
        path = out / f"run-{world}.json"
        path.write_text(json.dumps({"runs": [r for _, _, r in chosen], "timeout_s": 120}))
        codes[world] = launch_module("tensoropt.pipeline_runtime.worker", [str(path)],
                                     LaunchOptions(world, timeout_s=400))
        runs.update({name: (key, run) for name, key, run in chosen})
    return codes, runs


def slices(run: dict) -> int:
    """Slices of the global batch a run sums: replicas x micro-batches."""
    pipe = run["plan"]["pipeline"]
    return run["plan"]["devices"] // pipe["stages"] * pipe["micro_batches"]


def parity_errors(name: str, run: dict, reference, first: int = 0) -> list[str]:
    """What differs between a run's outputs (its metrics' losses, its ``params_dir``'s stage files)
    and the 1-process ``reference`` (losses, parameters) from step ``first`` on: each loss within
    1e-5 relative, each parameter within 1e-5 of its largest magnitude (empty: parity holds)."""
    ref_losses, ref_params = reference
    metrics = json.loads(Path(run["metrics"]).read_text())
    errors = []
    expected = ref_losses[first:]
    if metrics["first_step"] != first or len(metrics["losses"]) != len(expected):
        errors.append(f"{name}: {len(metrics['losses'])} losses from step {metrics['first_step']}")
    for i, (a, b) in enumerate(zip(metrics["losses"], expected)):
        if abs(a - b) > 1e-5 * abs(b):
            errors.append(f"{name}: loss at step {first + i} is {a}, 1 process gives {b}")
    params = {}
    for f in sorted(Path(run["params_dir"]).glob("stage-*.pt")):
        params.update({k: v for k, v in torch.load(f).items() if k in ref_params})
    if set(params) != set(ref_params):
        errors.append(f"{name}: parameters {sorted(set(ref_params) ^ set(params))} missing or extra")
    for key, ref in ref_params.items():
        if key in params:
            diff, scale = float((params[key] - ref).abs().max()), float(ref.abs().max())
            if diff > 1e-5 * scale:
                errors.append(f"{name}: parameter {key} differs by {diff:.3g} (scale {scale:.3g})")
    return errors
