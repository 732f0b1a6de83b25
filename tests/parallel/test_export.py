"""``tensoropt export CHECKPOINT_DIR --out DIR``: a `tensoropt run` checkpoint (DCP, the job's
training-step keys) as one model.safetensors under the user model's keys, with the HF config.json,
written atomically; ``from_pretrained`` and a strict ``load_state_dict`` read it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="the HuggingFace tests need the dev extra (transformers 5.x)")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loop_plans import hf_job  # noqa: E402

from tensoropt.checkpoint import job_hash, save_checkpoint  # noqa: E402
from tensoropt.cli import main  # noqa: E402
from tensoropt.executor.job.plan import ExecPlan  # noqa: E402
from tensoropt.executor.job.spec import TrainSpec  # noqa: E402
from tensoropt.training.trainer import Trainer  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A 1-process `tensoropt run`-style checkpoint of HF GPT-2 after 2 steps, and its parameters."""
    root = tmp_path_factory.mktemp("ckpt")
    spec = TrainSpec.from_job(hf_job("gpt2", 4, devices=1))
    trainer = Trainer(spec, ExecPlan.from_json({"id": "d1-p0", "mesh": {"shape": [], "levels": []},
                                                "placements": {}}))
    trainer.train(2)
    save_checkpoint(trainer, root, 2, job_hash(spec.to_json()), spec.to_json())
    return root, {k.removeprefix("model."): v for k, v in trainer.full_params().items()}


def test_export_writes_the_users_keys_and_from_pretrained_reads_them(checkpoint, tmp_path, capsys):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from tensoropt.models.hf import gpt2

    root, params = checkpoint
    assert main(["export", str(root), "--out", str(tmp_path / "model")]) == 0
    assert "model.safetensors" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["config.json", "model.safetensors"]
    state = load_file(str(tmp_path / "model" / "model.safetensors"))
    assert state["lm_head.weight"].equal(state["transformer.wte.weight"])  # tied: under both keys
    for key, value in params.items():
        assert torch.equal(state[key], value), key
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    plain = gpt2(**{k: v for k, v in model.config.to_dict().items() if k in ("n_layer", "n_embd", "n_head",
                                                                               "n_positions", "vocab_size")})
    plain.load_state_dict(state)  # strict: every key is there
    plain.eval()
    ids = torch.randint(0, 256, (2, 32))
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, plain(input_ids=ids).logits)


def test_export_in_bf16_and_to_an_unwritable_place(checkpoint, tmp_path, capsys):
    from safetensors.torch import load_file

    root, params = checkpoint
    assert main(["export", str(root), "--out", str(tmp_path / "bf16"), "--dtype", "bfloat16"]) == 0
    state = load_file(str(tmp_path / "bf16" / "model.safetensors"))
    assert all(v.dtype == torch.bfloat16 for v in state.values())
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    assert main(["export", str(root), "--out", str(blocker / "model")]) == 1
    assert "cannot write" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "bf16"]
    assert main(["export", str(tmp_path / "bf16"), "--out", str(tmp_path / "x")]) == 1
    assert "no complete checkpoint" in capsys.readouterr().err


def test_model_checkpoint_reads_a_save_pretrained_directory(tmp_path):
    """A job's ``model.checkpoint`` may name a ``save_pretrained`` directory: `tensoropt run`'s state
    then holds those weights (under the job's training-step keys)."""
    import dataclasses

    from tensoropt.executor.state.local_state import build_local_state
    from tensoropt.models.hf import gpt2

    job = hf_job("gpt2", 4, devices=1)
    torch.manual_seed(3)
    pretrained = gpt2(**job.model.kwargs)
    pretrained.save_pretrained(tmp_path / "pretrained")
    model = dataclasses.replace(job.model, checkpoint=str(tmp_path / "pretrained"))
    job = dataclasses.replace(job, model=model)
    spec = TrainSpec.from_job(job)
    plan = ExecPlan.from_json({"id": "d1-p0", "mesh": {"shape": [], "levels": []}, "placements": {}})
    state = build_local_state(spec, plan, None, torch.device("cpu"))
    expected = dict(pretrained.named_parameters())
    assert {k.removeprefix("model.") for k in state.params} <= set(expected)
    for key, value in state.params.items():
        assert torch.equal(value.detach(), expected[key.removeprefix("model.")].detach()), key
