"""The optimizer's weight-decay groups, metrics.jsonl (the contract's keys, one flushed line per log)
and the TensorBoard scalars read back from the event file."""

from __future__ import annotations

import json

import pytest
import torch

from tensoropt.config import OptimizerConfig
from tensoropt.training.metrics import (
    METRIC_KEYS,
    MetricsLogger,
    TensorBoardWriter,
    step_record,
    writable_directory_error,
)
from tensoropt.training.optimizer import build_optimizer, unmatched_words


def _model():
    return torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))


@pytest.mark.parametrize("name, cls", [("sgd", torch.optim.SGD), ("momentum", torch.optim.SGD),
                                       ("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW)])
def test_no_decay_groups_step_like_torch_with_the_same_groups(name, cls):
    """The built optimizer equals torch's, given the groups by hand: same parameters after 3 steps."""
    torch.manual_seed(0)
    ours, theirs = _model(), _model()
    theirs.load_state_dict(ours.state_dict())
    section = OptimizerConfig(name=name, lr=0.05, weight_decay=0.2, no_decay=["bias", "2."])
    opt = build_optimizer(ours.named_parameters(), section)
    decay = [p for n, p in theirs.named_parameters() if "bias" not in n and "2." not in n]
    rest = [p for n, p in theirs.named_parameters() if "bias" in n or "2." in n]
    kwargs = {"momentum": 0.9} if name == "momentum" else {}
    groups = [{"params": decay, "weight_decay": 0.2}, {"params": rest, "weight_decay": 0.0}]
    ref = cls(groups, lr=0.05, **kwargs)
    assert [len(g["params"]) for g in opt.param_groups] == [2, 3]
    for _ in range(3):
        for model, o in ((ours, opt), (theirs, ref)):
            o.zero_grad()
            model(torch.arange(6).view(2, 3)).pow(2).sum().backward()
            o.step()
    for (n, a), b in zip(ours.named_parameters(), theirs.parameters()):
        assert torch.equal(a, b), n


def test_unmatched_words_name_what_the_model_lacks():
    names = [n for n, _ in _model().named_parameters()]
    assert unmatched_words(names, ["bias", "norm", "embedding"]) == ["norm", "embedding"]


def test_metrics_jsonl_has_exactly_the_contract_keys_and_is_readable_while_open(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    log = MetricsLogger(path)
    for step in (1, 2):
        log.log(step_record(step=step, loss=2.0 / step, lr=1e-3, grad_norm=0.5, time_s=0.25, samples=16,
                            tokens=16 * 128, flops=4e12, peak_flops=1e13, devices=2, peak_bytes=1 << 20))
        rows = [json.loads(line) for line in path.read_text().splitlines()]  # before close: flushed
        assert len(rows) == step
    log.close()
    assert [list(r) for r in rows] == [list(METRIC_KEYS)] * 2
    assert rows[1]["samples_per_s"] == 64.0 and rows[1]["tokens_per_s"] == 64.0 * 128
    assert rows[1]["mfu"] == pytest.approx(4e12 / 0.25 / 2e13)
    with pytest.raises(ValueError, match="beyond the contract"):
        MetricsLogger(tmp_path / "x.jsonl").log({"step": 1, "accuracy": 0.5})


def test_tensorboard_gets_the_same_scalars(tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = MetricsLogger(tmp_path / "m.jsonl", tensorboard=TensorBoardWriter(tmp_path / "tb"))
    log.log(step_record(step=3, loss=1.5, lr=2e-4, grad_norm=0.7, time_s=0.5, samples=8, tokens=None,
                        flops=None, peak_flops=None, devices=1, peak_bytes=None))
    log.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"train/loss", "train/lr", "train/grad_norm", "train/time_s",
                                             "train/samples_per_s"}
    (loss,) = events.Scalars("train/loss")
    assert (loss.step, loss.value) == (3, 1.5)


def test_an_unwritable_directory_is_named(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert writable_directory_error(tmp_path / "tb", "metrics.tensorboard") is None
    error = writable_directory_error(blocked / "tb", "metrics.tensorboard")
    assert error.startswith("metrics.tensorboard: cannot write to") and str(blocked) in error
