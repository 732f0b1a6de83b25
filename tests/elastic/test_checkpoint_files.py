"""Checkpoint atomicity and identity, in one process: an incomplete or truncated checkpoint is
skipped with a warning naming it (the previous one is used); another job's is refused."""

from __future__ import annotations

import json

import pytest
from elastic_helpers import ONE_DEVICE, assert_params_close, mlp_spec

from tensoropt.checkpoint import (
    CheckpointMismatch,
    CheckpointWarning,
    job_hash,
    latest_checkpoint,
    list_checkpoints,
    read_manifest,
    resume,
    save_checkpoint,
    step_dir,
)
from tensoropt.training.trainer import Trainer

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(200),
              pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]

PLAN = ONE_DEVICE


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A directory with checkpoints after steps 1, 2, 3, and the parameters at step 2."""
    root = tmp_path_factory.mktemp("ckpt")
    spec = mlp_spec()
    trainer = Trainer(spec, PLAN)
    at = {}
    for step in range(3):
        trainer.train(1, start_step=step)
        save_checkpoint(trainer, root, step + 1, job_hash(spec.to_json()), spec.to_json(), keep=0)
        at[step + 1] = trainer.full_params()
    return root, at


def test_manifest_written_last_with_the_identity(saved):
    root, _ = saved
    manifest = read_manifest(step_dir(root, 2))
    assert (manifest.step, manifest.plan_id, manifest.world_size, manifest.complete) == (2, "d1-p0", 1, True)
    assert manifest.job_hash == job_hash(mlp_spec().to_json())
    assert ".metadata" in manifest.files and any(n.endswith(".distcp") for n in manifest.files)
    assert [f.manifest.step for f in list_checkpoints(root)] == [1, 2, 3]


def test_truncated_and_unfinished_checkpoints_are_skipped(saved, tmp_path):
    src, at = saved
    root = tmp_path / "ckpt"
    import shutil

    shutil.copytree(src, root)
    data = next(p for p in step_dir(root, 3).iterdir() if p.suffix == ".distcp")
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])  # truncated
    unfinished = step_dir(root, 4)
    unfinished.mkdir()
    (unfinished / "__0_0.distcp").write_bytes(b"partial")  # a save that died before its manifest
    with pytest.warns(CheckpointWarning) as caught:
        found = latest_checkpoint(root)
    messages = " | ".join(str(w.message) for w in caught)
    assert found.manifest.step == 2
    assert "step-00000003" in messages and "truncated" in messages, messages
    assert "step-00000004" in messages and "no manifest" in messages, messages

    trainer = Trainer(mlp_spec(), PLAN)
    with pytest.warns(CheckpointWarning):
        manifest = resume(trainer, root, job_hash(mlp_spec().to_json()))
    assert manifest.step == 2
    assert_params_close(trainer.full_params(), at[2], rtol=0.0)


def test_corrupt_manifest_is_skipped(saved, tmp_path):
    import shutil

    root = tmp_path / "ckpt"
    shutil.copytree(saved[0], root)
    (step_dir(root, 3) / "manifest.json").write_text('{"step": 3, "plan_')
    with pytest.warns(CheckpointWarning, match="step-00000003.*manifest is unreadable"):
        assert latest_checkpoint(root).manifest.step == 2


def test_checkpoint_of_another_job_is_refused(saved):
    root, _ = saved
    other = mlp_spec(lr=0.1)  # another learning rate: another job
    trainer = Trainer(other, PLAN)
    with pytest.raises(CheckpointMismatch) as err:
        resume(trainer, root, job_hash(other.to_json()))
    text = str(err.value)
    assert "another job" in text and "step-00000001" in text and "--checkpoint-dir" in text
    assert job_hash(mlp_spec().to_json()) in text and "lr=0.05" in text


def test_job_hash_ignores_total_steps_and_the_planner_job_only():
    spec = mlp_spec().to_json()
    replanned = {**spec["job"], "devices": [1, 2, 4, 8], "memory_budget": 1 << 30, "select": "fewest_devices"}
    assert job_hash(spec) == job_hash({**spec, "steps": 1000, "job": replanned})
    assert job_hash(spec) != job_hash({**spec, "job": {**spec["job"], "model": {**spec["job"]["model"],
                                                                                "num_classes": 10}}})
    assert job_hash(spec) != job_hash({**spec, "lr": 0.1})
    assert job_hash(spec) != job_hash({**spec, "seed": 1})
    assert job_hash(spec) == job_hash(json.loads(json.dumps(spec)))


def test_saving_keeps_the_newest_and_clears_failed_saves(tmp_path):
    spec = mlp_spec()
    trainer = Trainer(spec, PLAN)
    (step_dir(tmp_path, 1)).mkdir()  # a save that died before its manifest
    for done in (2, 3, 4):
        save_checkpoint(trainer, tmp_path, done, job_hash(spec.to_json()), spec.to_json(), keep=2)
    (step_dir(tmp_path, 9)).mkdir()  # a later leftover is not touched by an earlier step's save
    save_checkpoint(trainer, tmp_path, 5, job_hash(spec.to_json()), spec.to_json(), keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000004", "step-00000005", "step-00000009"]
