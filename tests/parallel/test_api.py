"""tensoropt.parallelize's contract beyond parity (issue 24), in one 2-process launch:

* bad input is refused with a clear error before any step: a plan for another world size or graph,
  a batch missing an input or with mismatching rows or sample shapes, an optimizer over tensors that
  are not the parallel model's (built before parallelize, or mixed with a stray tensor: nothing is
  changed), save_model to an unwritable place (every rank raises, nothing is left behind);
* no_sync: 4 micro-batches synchronise the gradients once per step, not 4 times (synchronisations
  and dispatched collectives counted), and accumulate the same gradients;
* a model built on meta gets exactly `tensoropt run`'s initial weights (seeded, shard by shard);
* fine-tune round trip: save_pretrained -> from_pretrained -> parallelize -> train -> save_model ->
  from_pretrained reads it back, and its logits equal the trained model's and plain PyTorch's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="the HuggingFace tests need the dev extra (transformers 5.x)")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from loop_plans import hf_job, model_config, one_device_plan, pick_plan  # noqa: E402
from loop_reference import build_model, make_batch, make_optimizer  # noqa: E402
from torchrun import torchrun  # noqa: E402

from tensoropt.executor.job.spec import TrainSpec  # noqa: E402

BATCH = 4


def _launch(config: dict, tmp_path: Path, timeout_s: float = 600):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return torchrun(HERE / "api_worker.py", [str(path)], timeout_s)


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("api")
    out = tmp / "out"
    out.mkdir()
    plans = {"gpt2": pick_plan("gpt2", BATCH, "model_parallel"),
             "batch_plan": pick_plan("gpt2", BATCH, "batch"), "one_device": one_device_plan("gpt2", BATCH)}
    config = {"out": str(out), "scenarios": ["errors", "no_sync", "meta_init", "finetune"]}
    for name, plan in plans.items():
        (tmp / f"{name}.json").write_text(json.dumps(plan))
        config[name] = str(tmp / f"{name}.json")
    gpt2_config, vocab, seq = model_config("gpt2")
    config["case"] = {"config": gpt2_config, "vocab": vocab, "seq": seq, "batch": BATCH, "max_norm": 0.5}
    config["llama_config"] = model_config("llama")[0]
    pretrained = tmp / "pretrained"
    build_model("gpt2", gpt2_config, seed=7).save_pretrained(pretrained)
    config["pretrained"] = str(pretrained)
    proc = _launch(config, tmp)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return config, out


def _load(out: Path, name: str) -> dict:
    return torch.load(out / f"{name}.pt", weights_only=False)


@pytest.mark.distributed
@pytest.mark.slow
def test_bad_input_gets_a_clear_error_before_any_step(launched):
    _, out = launched
    e = _load(out, "errors")
    assert "needs 1 processes but 2 are running" in e["world_size"] and "--nproc 1" in e["world_size"]
    assert e["graph"].startswith("PlanGraphMismatch") and "another graph" in e["graph"]
    assert "missing input 'labels'" in e["missing_input"]
    assert "'labels' has 3 rows but 'input_ids' has 4" in e["rows"]
    assert "samples of shape [8], the plan's are [32]" in e["seq"]
    assert e["early_optimizer"].startswith("ForeignParameters")
    assert "parallelize replaced" in e["early_optimizer"] and "after parallelize" in e["early_optimizer"]
    assert "not a parameter of the parallel model" in e["mixed_optimizer"]
    assert e["unchanged"], "a refused optimizer step changed the parameters"
    assert e["unwritable"].startswith("SaveError") and "cannot write" in e["unwritable"]
    assert e["left_behind"] == ["a-file"], e["left_behind"]


@pytest.mark.distributed
@pytest.mark.slow
def test_no_sync_synchronises_four_micro_batches_once(launched):
    _, out = launched
    r = _load(out, "no_sync")
    assert r["no_sync"]["grad_syncs"] == 1 and r["sync"]["grad_syncs"] == 4
    per_sync = r["one_sync"] - r["one_no_sync"]  # the gradient collectives of one synchronisation
    assert per_sync > 0
    assert r["sync"]["collectives"] == 4 * r["one_sync"]
    assert r["no_sync"]["collectives"] == 4 * r["one_no_sync"] + per_sync, r  # one synchronisation, not 4
    for key, grad in r["sync"]["grads"].items():
        assert torch.allclose(r["no_sync"]["grads"][key], grad, rtol=1e-5, atol=1e-7), key


@pytest.mark.distributed
@pytest.mark.slow
def test_a_meta_model_gets_tensoropt_runs_initial_weights(launched):
    _, out = launched
    state = _load(out, "meta_init")["state"]
    spec = TrainSpec.from_job(hf_job("gpt2", BATCH))
    reference = {k.removeprefix("model."): v for k, v in spec.build_model().state_dict().items()}
    assert sorted(state) == sorted(reference)
    for key, value in reference.items():
        assert torch.equal(state[key], value), key


@pytest.mark.distributed
@pytest.mark.slow
def test_fine_tune_round_trip_through_save_model_and_from_pretrained(launched):
    from transformers import AutoModelForCausalLM

    config, out = launched
    r = _load(out, "finetune")
    assert r["is_parallel"] and r["class"] == "ParallelGPT2LMHeadModel"
    assert sorted(p.name for p in (out / "finetuned").iterdir()) == ["config.json", "model.safetensors"]
    loaded = AutoModelForCausalLM.from_pretrained(out / "finetuned")
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, r["state"][key]), key
    # the same fine-tuning in plain PyTorch, from the same pretrained weights
    plain = AutoModelForCausalLM.from_pretrained(config["pretrained"])
    opt, sched = make_optimizer(plain, 3)
    losses = []
    for step in range(3):
        loss = plain(**make_batch(config["case"], step)).loss
        loss.backward()
        losses.append(float(loss.detach()))
        torch.nn.utils.clip_grad_norm_(plain.parameters(), config["case"]["max_norm"])
        opt.step()
        sched.step()
        opt.zero_grad()
    assert r["losses"] == pytest.approx(losses, rel=1e-5)
    ids = make_batch(config["case"], 9)["input_ids"]
    with torch.no_grad():
        got, want = loaded(input_ids=ids).logits, plain(input_ids=ids).logits
        trained = AutoModelForCausalLM.from_pretrained(config["pretrained"])
        trained.load_state_dict(r["state"])
        assert torch.equal(got, trained(input_ids=ids).logits)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
