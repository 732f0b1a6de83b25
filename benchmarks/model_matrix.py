"""The support matrix: every architecture as its library makes it, planned and run on 2 processes.

Models: every causal-LM, masked-LM and image-classification architecture ``transformers`` ships
(its auto mappings), built from a tiny config (:func:`tiny_config`: width 64, 2 layers, vocabulary
256, 32 x 32 images; nothing downloaded) with ``tensoropt.models.hf_auto:build``, the factory a job
names. (timm and torchvision: neither imports with the CPU build of torch 2.13.0 that the registry's
wheels pair with, see docs/models.md; their CNN and ViT families are covered by transformers' own
ResNet, RegNet, MobileNet, EfficientNet, ConvNeXt, ViT, DeiT, BEiT, Swin, ... and the zoo's ResNet.)

For each model: ``plan`` at 1 and 2 devices; the lowest-memory 2-device plan that splits more than
the batch (model-parallel) ``run`` on 2 processes (one torchrun launch per model, so one crash
stays one row) for 3 steps with SGD, its losses and parameters against 1 process (fp32, rtol 1e-5;
where step 0 matches and the later steps drift, both runs again in float64, which tells rounding an
unstable run amplifies from a gradient bug: :func:`float64_parity_errors`); predicted against
measured step time and peak. The outcome of each model is one of

* ``runs, matches``: the 2-process run matches 1 process;
* ``planning error``: ``plan`` stopped with a message naming the op or module and the way out;
* ``build error``: transformers cannot build or run the tiny config on the CPU (not ours);
* ``crash`` / ``mismatch``: a bug of ours (the row says where and why).

It writes docs/models.md (the table) and a JSON of every row.

Usage::

    .venv/bin/python benchmarks/model_matrix.py                        # the default list (DEFAULT)
    .venv/bin/python benchmarks/model_matrix.py --all                  # every architecture
    .venv/bin/python benchmarks/model_matrix.py --only GPT2LMHeadModel ViTForImageClassification
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FAMILIES = {"causal_lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
            "masked_lm": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
            "image_classification": "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"}
"""Family -> the transformers auto mapping (model type -> model class name) that lists it."""

WIDTH = 64
LAYERS = 2
HEADS = 4
VOCAB = 256
SEQ = 32
IMAGE = 32
CLASSES = 4
BATCH = 8
STEPS = 3

_WIDTH_KEYS = ("hidden_size", "n_embd", "d_model", "dim", "n_embed")
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers", "encoder_layers")
_HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads", "decoder_attention_heads",
              "encoder_attention_heads")
_FFN_KEYS = ("intermediate_size", "n_inner", "ffn_dim", "decoder_ffn_dim", "encoder_ffn_dim", "d_ff",
             "d_inner")
_POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len")

VISION = {
    "vit": {"hidden_size": WIDTH, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
            "intermediate_size": 2 * WIDTH, "image_size": IMAGE, "patch_size": 8},
    "resnet": {"embedding_size": 16, "hidden_sizes": [16, 32], "depths": [1, 1], "layer_type": "basic"},
    "regnet": {"embedding_size": 16, "hidden_sizes": [16, 32], "depths": [1, 1], "groups_width": 8},
    "convnext": {"hidden_sizes": [16, 32], "depths": [1, 1], "num_stages": 2},
    "convnextv2": {"hidden_sizes": [16, 32], "depths": [1, 1], "num_stages": 2},
    "mobilenet_v1": {"depth_multiplier": 0.25, "image_size": IMAGE},
    "mobilenet_v2": {"depth_multiplier": 0.25, "image_size": IMAGE},
    "efficientnet": {"width_coefficient": 0.1, "depth_coefficient": 0.1, "image_size": IMAGE,
                     "hidden_dim": 64},
    "bit": {"embedding_size": 16, "hidden_sizes": [16, 32], "depths": [1, 1], "layer_type": "bottleneck"},
    "swin": {"embed_dim": 16, "depths": [1, 1], "num_heads": [2, 4], "image_size": IMAGE, "patch_size": 4,
             "window_size": 4},
    "swinv2": {"embed_dim": 16, "depths": [1, 1], "num_heads": [2, 4], "image_size": IMAGE, "patch_size": 4,
               "window_size": 4},
    "poolformer": {"hidden_sizes": [16, 32], "depths": [1, 1], "num_encoder_blocks": 2,
                   "patch_sizes": [7, 3], "strides": [4, 2], "padding": [2, 1]},
}
"""Tiny configs of vision model types whose widths are lists (stages) or multipliers; the ViT-like
types use the ``vit`` entry's keys where their config has them."""


def architectures(family: str) -> list[tuple[str, str]]:
    """(model type, model class name) of every architecture of ``family`` transformers ships.

    Example:
        >>> ("gpt2", "GPT2LMHeadModel") in architectures("causal_lm")
        True
    """
    import transformers
    from transformers.models.auto import modeling_auto

    mapping = getattr(modeling_auto, FAMILIES[family])
    rows = {}
    for model_type, names in mapping.items():
        name = names if isinstance(names, str) else names[0]
        cls = getattr(transformers, name, None)
        own_type = getattr(getattr(cls, "config_class", None), "model_type", model_type)
        if name not in rows or model_type == own_type:  # a class listed twice: under its own type
            rows[name] = model_type
    return [(model_type, name) for name, model_type in rows.items()]


def _defaults(model_type: str) -> dict:
    from transformers import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type]().to_dict()


def tiny_config(model_type: str, family: str) -> dict:
    """The config kwargs of a tiny ``model_type``: width 64, 2 layers, 4 heads (2 key/value heads),
    FFN 128, vocabulary 256, 64 positions, MoE with 4 experts (2 per token), no dropout; images
    32 x 32 with 4 classes. Only keys the model's config has are set.

    Example:
        >>> kw = tiny_config("gpt2", "causal_lm")
        >>> kw["n_embd"], kw["n_layer"], kw["vocab_size"], kw["resid_pdrop"]
        (64, 2, 256, 0.0)
    """
    defaults = _defaults(model_type)
    out: dict = {}

    def put(keys, value):
        for key in keys:
            if key in defaults and not isinstance(defaults[key], (list, dict)):
                out[key] = value

    put(_WIDTH_KEYS, WIDTH)
    put(_LAYER_KEYS, LAYERS)
    put(_HEAD_KEYS, HEADS)
    put(("num_key_value_heads", "multi_query_group_num"), HEADS // 2)
    put(_FFN_KEYS, 2 * WIDTH)
    put(("head_dim", "attention_head_size", "kv_channels", "rotary_dim"), WIDTH // HEADS)
    put(("vocab_size",), VOCAB)
    put(_POSITION_KEYS, 64)
    put(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), 4)
    put(("num_experts_per_tok", "moe_topk", "top_k"), 2)
    put(("moe_intermediate_size", "expert_intermediate_size"), WIDTH)
    put(("embedding_size",), WIDTH)
    for key, value in defaults.items():  # dropout, drop path, layer drop off: a run must match 1 process
        if "drop" in key and isinstance(value, float):
            out[key] = 0.0
    if family == "image_classification":
        out.update({k: v for k, v in VISION["vit"].items() if k in defaults})
        out.update(VISION.get(model_type, {}))
        out["num_labels"] = CLASSES
        if "num_channels" in defaults:
            out["num_channels"] = 3
    # token ids: pad/bos/eos must lie inside the tiny vocabulary
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id",
                "cls_token_id", "mask_token_id", "unk_token_id"):
        if isinstance(defaults.get(key), int) and defaults[key] >= VOCAB:
            out[key] = 1
    return out


def inputs_spec(family: str, config: dict) -> dict:
    """``model.inputs`` of a job of this family (one sample each).

    Example:
        >>> inputs_spec("causal_lm", {})["input_ids"]
        {'shape': [32], 'dtype': 'int64', 'high': 256}
    """
    if family == "image_classification":
        return {"pixel_values": {"shape": [3, IMAGE, IMAGE], "dtype": "float32"},
                "labels": {"shape": [], "dtype": "int64", "high": CLASSES}}
    tokens = {"shape": [SEQ], "dtype": "int64", "high": VOCAB}
    return {"input_ids": tokens, "labels": dict(tokens)}


def example_batch(family: str, config: dict, batch_size: int) -> dict:
    """A random batch keyed like :func:`inputs_spec` (for a quick forward outside the planner).

    Example:
        >>> example_batch("image_classification", {}, 2)["pixel_values"].shape
        torch.Size([2, 3, 32, 32])
    """
    import torch

    batch = {}
    for name, spec in inputs_spec(family, config).items():
        shape = (batch_size, *spec["shape"])
        if spec["dtype"] == "int64":
            batch[name] = torch.randint(0, spec["high"], shape)
        else:
            batch[name] = torch.randn(shape)
    return batch


def job_dict(architecture: str, family: str, config: dict, devices: list[int] | None = None) -> dict:
    """The job (as a YAML mapping) that plans and runs one matrix model: SGD with momentum (AdamW
    turns an exactly-zero gradient into noise-driven steps no parity tolerance holds).

    Example:
        >>> job_dict("GPT2LMHeadModel", "causal_lm", {"n_layer": 2})["model"]["factory"]
        'tensoropt.models.hf_auto:build'
    """
    return {"model": {"factory": "tensoropt.models.hf_auto:build",
                      "kwargs": {"architecture": architecture, **config},
                      "inputs": inputs_spec(family, config), "loss": "model"},
            "training": {"global_batch_size": BATCH, "optimizer": "momentum", "learning_rate": 0.05,
                         "seed": 0, "steps": STEPS},
            "cluster": "cpu-local", "devices": devices or [1, 2]}


def model_parallel_plan(frontier_json: dict, devices: int = 2) -> dict | None:
    """The plan.json of the lowest-memory ``devices`` plan that splits more than the batch (None
    where every plan is data parallel).

    Example:
        >>> model_parallel_plan({"frontiers": []}) is None
        True
    """
    from tensoropt.plans import plan_file_text

    for frontier in frontier_json["frontiers"]:
        if frontier["devices"] != devices:
            continue
        for p in sorted(frontier["plans"], key=lambda p: p["memory_bytes"]):
            plan = json.loads(plan_file_text(frontier_json, p["id"]))
            labels = {c["label"] for c in plan["placements"].values()}
            if any(not label.startswith(("batch", "replicate")) for label in labels):
                return plan
    return None


def parity_errors(losses: list[float], params: dict, ref_losses: list[float], ref_params: dict,
                  rtol: float = 1e-5) -> list[str]:
    """Where a run's losses and final parameters differ from 1 process by more than ``rtol``
    (relative to the tensor's largest entry, floored at 1e-2: a bias whose gradient is 0 stays ~0).

    Example:
        >>> import torch
        >>> parity_errors([1.0], {"w": torch.ones(2)}, [1.0], {"w": torch.ones(2)})
        []
    """
    errors = [f"loss at step {i}: {a} against {b}" for i, (a, b) in enumerate(zip(losses, ref_losses))
              if abs(a - b) > rtol * abs(b)]
    if len(losses) != len(ref_losses):
        errors.append(f"{len(losses)} steps against {len(ref_losses)}")
    for key, ref in ref_params.items():
        if key not in params:
            errors.append(f"parameter {key} missing")
            continue
        diff = float((params[key] - ref).abs().max())
        if diff > rtol * max(float(ref.abs().max()), 1e-2):
            errors.append(f"parameter {key} differs by {diff:.3g}")
    return errors


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:400]}"


def _is_clear_planning_error(err: BaseException) -> bool:
    """A planning-time error of ours: a tensoropt error class whose message names the cause."""
    return type(err).__module__.startswith(("tensoropt", "estimators")) and type(err).__name__ not in (
        "AssertionError",)


def measure(model_type: str, architecture: str, family: str, workdir: Path,
            report=lambda stage: None) -> dict:
    """One row of the matrix: build, plan at 1 and 2 devices, run a model-parallel plan on 2
    processes against 1 process. Every stage's failure becomes the row's outcome; ``report(stage)``
    is called as each stage starts.

    Example:
        >>> # not run here: plans and starts torchrun workers (a minute per model)
        >>> measure("gpt2", "GPT2LMHeadModel", "causal_lm", Path(tmp))["outcome"]  # doctest: +SKIP
        'runs, matches'
    """
    import torch

    from tensoropt.config import Job
    from tensoropt.executor.job.spec import TrainSpec
    from tensoropt.models.hf_auto import build
    from tensoropt.planner import plan_job

    row = {"model_type": model_type, "architecture": architecture, "family": family}
    start = time.perf_counter()
    report("build")
    try:  # transformers' own eager step on the tiny config: a failure here is not ours
        config = tiny_config(model_type, family)
        torch.manual_seed(0)
        model = build(architecture, **config)
        row["params"] = sum(p.numel() for p in model.parameters())
        model(**example_batch(family, config, 2)).loss.backward()
        del model
    except Exception as err:  # noqa: BLE001 - recorded
        return {**row, "outcome": "build error", "stage": "build", "reason": _one_line(err)}
    job = Job.from_dict(job_dict(architecture, family, config))
    try:
        report("plan")
        frontier = plan_job(job).to_json()
    except Exception as err:  # noqa: BLE001 - recorded
        clear = _is_clear_planning_error(err)
        return {**row, "outcome": "planning error" if clear else "crash", "stage": "plan",
                "reason": _one_line(err), **({} if clear else {"traceback": traceback.format_exc()})}
    row["plan_s"] = time.perf_counter() - start
    row["plans"] = [len(f["plans"]) for f in frontier["frontiers"]]
    plan = model_parallel_plan(frontier)
    if plan is None:
        return {**row, "outcome": "no model-parallel plan", "stage": "select",
                "reason": "every 2-device plan on the frontier is data parallel"}
    labels = sorted({c["label"] for c in plan["placements"].values()} - {"replicate"})
    row.update(plan_id=plan["id"], plan_labels=labels, predicted_time_s=plan.get("time_s"),
               predicted_memory_bytes=plan.get("memory_bytes"))
    two = dataclasses.replace(job, devices=[2])
    spec = TrainSpec.from_job(two, steps=STEPS)
    report("run (1 process)")
    try:
        ref_losses, ref_params = _single_process(spec)
    except Exception as err:  # noqa: BLE001 - recorded
        return {**row, "outcome": "crash", "stage": "run (1 process)", "reason": _one_line(err),
                "traceback": traceback.format_exc()}
    report("run (2 processes)")
    rc, ran = _two_processes(spec, plan, workdir)
    if ran is None:
        return {**row, "outcome": "crash", "stage": "run (2 processes)",
                "reason": f"torchrun exit code {rc} (the worker's error is in the log)"}
    metrics, params = ran
    losses = [s["loss"] for s in metrics["steps"]]
    errors = parity_errors(losses, params, ref_losses, ref_params)
    row.update(measured_time_s=metrics["measured"]["time_s"],
               measured_peak_bytes=metrics["measured"]["peak_bytes"],
               predicted_peak_bytes=metrics["predicted"].get("peak_bytes"),
               measured_memory_bytes=metrics["measured"]["memory_bytes"],
               peak_tensor_bytes=metrics["measured"].get("peak_tensor_bytes"),
               predicted_peak_tensor_bytes=metrics["predicted"].get("peak_tensor_bytes"),
               load_average=os.getloadavg()[0],
               max_loss_error=max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses)),
               seconds=time.perf_counter() - start)
    if errors and not parity_errors(losses[:1], {}, ref_losses[:1], {}):
        report("parity (float64)")  # step 0 matches, the updates drift: rounding or a gradient bug?
        float64_errors = float64_parity_errors(spec, plan, workdir / "float64")
        row["float64_errors"] = float64_errors
        if not float64_errors:
            return {**row, "outcome": "runs, matches", "stage": "parity",
                    "reason": f"float32 drifts after the first update ({errors[0]}): the unstable run "
                              "amplifies rounding; float64 matches"}
        errors += [f"float64: {e}" for e in float64_errors]
    if errors:
        return {**row, "outcome": "mismatch", "stage": "parity", "reason": "; ".join(errors[:3])}
    return {**row, "outcome": "runs, matches", "stage": "", "reason": ""}


def _single_process(spec) -> tuple[list[float], dict]:
    """Losses and final parameters of ``spec`` trained on 1 process (no mesh, the fx interpreter)."""
    from tensoropt.executor.job.plan import ExecPlan
    from tensoropt.training.trainer import Trainer

    single = Trainer(spec, ExecPlan.from_json({"id": "single", "mesh": {"shape": [], "levels": []},
                                                "placements": {}}), mode="interpret")
    losses = [s["loss"] for s in single.train(STEPS).steps]
    return losses, single.full_params()


def _two_processes(spec, plan: dict, workdir: Path) -> tuple[int, tuple[dict, dict] | None]:
    """(torchrun's exit code, (metrics, final parameters) of ``plan`` trained on 2 processes or None
    where the launch failed)."""
    import torch

    from tensoropt.launch import LaunchOptions, launch_workers

    workdir.mkdir(parents=True, exist_ok=True)
    metrics_path, params_path = workdir / "metrics.json", workdir / "params.pt"
    config_run = {"steps": STEPS, "runs": [{"spec": spec.to_json(), "plan": plan,
                                            "metrics": str(metrics_path), "params_out": str(params_path)}]}
    rc = launch_workers(config_run, LaunchOptions(2, timeout_s=RUN_TIMEOUT_S),
                        env={"TENSOROPT_COLLECTIVE_TIMEOUT_S": "120"})
    if rc != 0 or not metrics_path.exists():
        return rc, None
    return rc, (json.loads(metrics_path.read_text()), torch.load(params_path))


def float64_parity_errors(spec, plan: dict, workdir: Path) -> list[str]:
    """:func:`parity_errors` of ``plan`` on 2 processes against 1 process, both in float64.

    A run whose float32 losses match at step 0 and drift after the first update is either a
    gradient bug of ours or an unstable run (a large step on a badly conditioned model: MobileNetV2's
    tiny-init convolutions under batch norm) that amplifies float32 rounding (1e-7) past the
    tolerance in a step or two. Float64 rounding (1e-16) amplified as much stays far inside it,
    while a wrong gradient is as wrong in float64: an empty list says the plan computes what 1
    process does.

    Example:
        >>> # not run here: two more runs of the model (minutes)
        >>> float64_parity_errors(spec, plan, Path(tmp))  # doctest: +SKIP
        []
    """
    wide = dataclasses.replace(spec, dtype="float64")
    try:
        ref_losses, ref_params = _single_process(wide)
    except Exception as err:  # noqa: BLE001 - recorded
        return [f"run (1 process) crashed: {_one_line(err)}"]
    rc, ran = _two_processes(wide, plan, workdir)
    if ran is None:
        return [f"run (2 processes): torchrun exit code {rc} (the worker's error is in the log)"]
    metrics, params = ran
    return parity_errors([s["loss"] for s in metrics["steps"]], params, ref_losses, ref_params)


RUN_TIMEOUT_S = 600

DEFAULT = (
    # decoder LMs
    "GPT2LMHeadModel", "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
    "GemmaForCausalLM", "Gemma2ForCausalLM", "Phi3ForCausalLM", "PhiForCausalLM", "GPTNeoXForCausalLM",
    "GPTNeoForCausalLM", "GPTJForCausalLM", "OPTForCausalLM", "BloomForCausalLM", "FalconForCausalLM",
    "CodeGenForCausalLM", "GPTBigCodeForCausalLM", "StableLmForCausalLM", "OlmoForCausalLM",
    "Olmo2ForCausalLM", "CohereForCausalLM", "Starcoder2ForCausalLM", "GraniteForCausalLM",
    "MixtralForCausalLM", "Qwen2MoeForCausalLM", "OpenAIGPTLMHeadModel", "BioGptForCausalLM",
    "XGLMForCausalLM", "MptForCausalLM", "MambaForCausalLM",
    # encoder (masked) LMs
    "BertForMaskedLM", "RobertaForMaskedLM", "DistilBertForMaskedLM", "AlbertForMaskedLM",
    "ElectraForMaskedLM", "DebertaV2ForMaskedLM", "ModernBertForMaskedLM", "MPNetForMaskedLM",
    "RoFormerForMaskedLM", "XLMRobertaForMaskedLM", "ConvBertForMaskedLM", "MegatronBertForMaskedLM",
    # image classification: ViTs and CNNs
    "ViTForImageClassification", "DeiTForImageClassification", "BeitForImageClassification",
    "Dinov2ForImageClassification", "SwinForImageClassification", "ResNetForImageClassification",
    "ConvNextForImageClassification", "RegNetForImageClassification", "MobileNetV2ForImageClassification",
    "MobileNetV1ForImageClassification", "PoolFormerForImageClassification",
)
"""The matrix's default list: the popular architectures of each family (``--all``: every one)."""

SAMPLE = ("GPT2LMHeadModel", "BertForMaskedLM", "ViTForImageClassification", "ResNetForImageClassification")
"""The CI sample (tests/hf/test_model_matrix.py): one model per family (decoder LM, encoder LM,
ViT, CNN with batch norm)."""

OUTCOMES = ("runs, matches", "planning error", "no model-parallel plan", "build error", "mismatch", "crash")


def _worker_error(log: str) -> str | None:
    """The first worker's one-line failure in a launch's log (``[tensoropt] rank R failed: ...``)."""
    for line in log.splitlines():
        if "[tensoropt] rank" in line and "failed:" in line:
            return line.split("failed:", 1)[1].strip()[:400]
    return None


def run_row(model_type: str, architecture: str, family: str, out: Path, timeout_s: float) -> dict:
    """:func:`measure` in a child process (a crash or a hang stays one row), its log kept in ``out``.

    Example:
        >>> # not run here: a minute per model
        >>> run_row("gpt2", "GPT2LMHeadModel", "causal_lm", Path(tmp), 900)["outcome"]  # doctest: +SKIP
        'runs, matches'
    """
    import subprocess

    out.mkdir(parents=True, exist_ok=True)
    row_file, log_file = out / f"{architecture}.json", out / f"{architecture}.log"
    stage_file = out / f"{architecture}.stage"
    for f in (row_file, stage_file):
        f.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--one", model_type, architecture, family, "--out", str(out)]
    why = None
    with log_file.open("w") as log:
        child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while child.poll() is None:
            rss = _rss_bytes(child.pid)
            if rss > MAX_RESIDENT_BYTES:
                why = f"killed: {rss / 2**30:.1f} GiB resident, over {MAX_RESIDENT_BYTES / 2**30:.0f} GiB"
            elif time.monotonic() > deadline:
                why = f"killed: no result within {timeout_s:.0f} s"
            if why:
                os.killpg(child.pid, 9)
                child.wait()
                break
            time.sleep(2)
    text = log_file.read_text(errors="replace")
    if not row_file.exists():
        stage = stage_file.read_text() if stage_file.exists() else "start"
        return {"model_type": model_type, "architecture": architecture, "family": family,
                "outcome": "crash", "stage": stage, "reason": why or _worker_error(text) or "no result"}
    row = json.loads(row_file.read_text())
    if row["outcome"] == "crash" and row["stage"] == "run (2 processes)":
        row["reason"] = _worker_error(text) or row["reason"]
        row_file.write_text(json.dumps(row, indent=1))
    return row


MAX_RESIDENT_BYTES = 4 << 30
"""A matrix model whose process grows past this is stopped (the machine is shared)."""


def _rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def _ms(s) -> str:
    return "-" if s is None else f"{s * 1e3:.1f}"


def markdown(rows: list[dict], header: str = "") -> str:
    """docs/models.md's table of ``rows`` (one per architecture), with counts per outcome.

    Example:
        >>> print(markdown([{"architecture": "A", "family": "causal_lm", "outcome": "crash",
        ...                  "stage": "plan", "reason": "x"}]).splitlines()[-1])
        | causal_lm | A | - | crash | plan: x | - | - | - | - |
    """
    counts = {o: sum(r["outcome"] == o for r in rows) for o in OUTCOMES}
    summary = ", ".join(f"{n} {o}" for o, n in counts.items() if n)
    loads = [r["load_average"] for r in rows if r.get("load_average") is not None]
    load = (f" Step times measured at load averages {min(loads):.0f}-{max(loads):.0f} on this machine's "
            f"{os.cpu_count()} cores (shared): the measured column is slowed by that much." if loads else "")
    lines = [header, f"{len(rows)} architectures: {summary}.{load}", "",
             "| family | architecture | params | outcome | stage: why | plan (2 processes) "
             "| step ms, predicted → measured | peak tensor MiB, predicted → measured "
             "| peak resident MiB, predicted → measured |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["family"], r["architecture"])):
        why = f"{r['stage']}: {r['reason']}" if r.get("reason") else ""
        plan = ", ".join(r.get("plan_labels", [])) or "-"
        time_ = f"{_ms(r.get('predicted_time_s'))} → {_ms(r.get('measured_time_s'))}" \
            if r.get("measured_time_s") is not None else "-"
        peak = f"{_mib(r.get('predicted_peak_bytes'))} → {_mib(r.get('measured_peak_bytes'))}" \
            if r.get("measured_peak_bytes") is not None else "-"
        tensors = f"{_mib(r.get('predicted_peak_tensor_bytes'))} → {_mib(r.get('peak_tensor_bytes'))}" \
            if r.get("peak_tensor_bytes") else "-"
        params = f"{r['params'] / 1e3:.0f} k" if r.get("params") else "-"
        lines.append(f"| {r['family']} | {r['architecture']} | {params} | {r['outcome']} | "
                     f"{why.replace('|', '/')} | {plan} | {time_} | {tensors} | {peak} |")
    return "\n".join(lines)


def selected(names: list[str] | None, every: bool) -> list[tuple[str, str, str]]:
    """(model type, architecture, family) to measure: ``names``, every one, or :data:`DEFAULT`.

    Example:
        >>> selected(["BertForMaskedLM"], False)
        [('bert', 'BertForMaskedLM', 'masked_lm')]
    """
    wanted = None if every else list(names or DEFAULT)
    rows = {}
    for family in FAMILIES:
        for model_type, arch in architectures(family):
            if arch not in rows and (wanted is None or arch in wanted):
                rows[arch] = (model_type, arch, family)
    return list(rows.values()) if wanted is None else [rows[a] for a in wanted if a in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", help="these architectures (model class names)")
    parser.add_argument("--all", action="store_true", help="every architecture of the three families")
    parser.add_argument("--out", default=str(REPO / "out" / "model_matrix"),
                        help="rows and logs (default out/model_matrix); rows.json accumulates across runs")
    parser.add_argument("--doc", default=str(REPO / "docs" / "models.md"), help="the table to write")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per model")
    parser.add_argument("--rows", nargs="+", help="only write the table from these rows.json (or one "
                        "model's ARCH.json) files, a later file's row replacing an earlier one's")
    parser.add_argument("--one", nargs=3, metavar=("TYPE", "ARCH", "FAMILY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    out = Path(args.out)
    if args.one:
        # the solver's own limit (a planning error naming what to change) before the 4 GiB stop
        os.environ.setdefault("TENSOROPT_SOLVER_MEMORY_GIB", "3")
        model_type, arch, family = args.one
        with tempfile.TemporaryDirectory(prefix="matrix-") as tmp:
            row = measure(model_type, arch, family, Path(tmp),
                          report=(out / f"{arch}.stage").write_text)
        (out / f"{arch}.json").write_text(json.dumps(row, indent=1))
        return
    if args.rows:
        loaded = [json.loads(Path(f).read_text()) for f in args.rows]  # rows.json or one model's row
        merged = {r["architecture"]: r
                  for rows in loaded for r in ([rows] if isinstance(rows, dict) else rows)}
        Path(args.doc).write_text(DOC_HEADER + markdown(list(merged.values())) + "\n")
        return
    out.mkdir(parents=True, exist_ok=True)
    rows_file = out / "rows.json"
    rows = {r["architecture"]: r for r in json.loads(rows_file.read_text())} if rows_file.exists() else {}
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    for model_type, arch, family in selected(args.only, args.all):
        row = run_row(model_type, arch, family, out, args.timeout)
        rows[arch] = row
        rows_file.write_text(json.dumps(list(rows.values()), indent=1))
        Path(args.doc).write_text(DOC_HEADER + markdown(list(rows.values())) + "\n")
        print(f"{family:20s} {arch:42s} {row['outcome']:15s} {row.get('stage', '')}: "
              f"{row.get('reason', '')[:150]}", flush=True)

DOC_HEADER = """# Support matrix

Written by `benchmarks/model_matrix.py` (do not edit by hand: rerun it). Every causal-LM, masked-LM
and image-classification architecture of `transformers` is built from a tiny config as the library
makes it (width 64, 2 layers, 4 heads, vocabulary 256, sequence 32, 32 x 32 images, no dropout;
nothing downloaded) through `tensoropt.models.hf_auto:build`, planned at 1 and 2 devices, and the
lowest-memory 2-device plan that splits more than the batch runs 3 SGD steps on 2 CPU processes
(gloo), its losses and parameters checked against 1 process (fp32, rtol 1e-5; where step 0 matches
and later steps drift, both run again in float64 at the same tolerance: a run that drifts in fp32
and matches in float64 is an unstable one amplifying fp32 rounding, and its row says so). Step times and peaks
are those tiny models' (CPU, 2 processes, analytical costs): a check that nothing is wildly off,
not a fidelity figure (see docs/results.md for those).

Outcomes: **runs, matches**; **planning error** (`tensoropt plan` stops with a message naming the
op or module and the way out); **no model-parallel plan** (every 2-device frontier plan is data
parallel); **build error** (transformers itself cannot build or train the tiny config on the CPU:
a missing optional library, a config the tiny sizes do not fit); **mismatch** or **crash** (a bug
of ours; the row says the stage and the error).

timm and torchvision are not in the matrix: torchvision 0.28.0, the one release pinned to torch
2.13.0, ships only a CUDA-linked wheel on the package registry (its `_C.so` needs
`libc10_cuda.so`, so `import torchvision` fails on the CPU build of torch), and timm imports
torchvision. Their CNN and ViT families are covered by transformers' own (ResNet, RegNet,
MobileNet, ConvNeXt, ViT, DeiT, BEiT, DINOv2, Swin, ...).

The table lists the architectures measured so far; `--all` measures every one of the three
mappings (277 classes in transformers 5.24; at 2-3 minutes a model on this machine, a long run).

What to do when your model is not supported: see the user guide, "When a model is not supported".

"""


if __name__ == "__main__":
    main()
