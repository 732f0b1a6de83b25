"""One pruning rule for both checkpoint layouts (tensoropt/checkpoint/prune.py): the executor's
worker's ``step-0000000N`` folders (complete when the manifest matches the files) and the trainers'
``step-N`` folders (complete once ``trainer.json`` is written) share a directory, and each runtime
prunes only its own."""

from __future__ import annotations

from tensoropt.checkpoint.manifest import MANIFEST_LAYOUT, Manifest, step_dir, write_manifest
from tensoropt.checkpoint.prune import prune_step_folders
from tensoropt.checkpoint.trainer_format import TRAINER_STATE, prune_checkpoints


def test_each_layout_keeps_its_newest_complete_folders_and_leaves_the_other_alone(tmp_path):
    for n in (1, 2, 3):  # the executor's worker's checkpoints
        folder = step_dir(tmp_path, n)
        folder.mkdir()
        (folder / "0.distcp").write_bytes(b"x" * 8)
        write_manifest(folder, Manifest(n, "d1-p0", 1, "hash"))
    (step_dir(tmp_path, 2) / "0.distcp").write_bytes(b"x" * 4)  # truncated: incomplete
    step_dir(tmp_path, 0).mkdir()  # a save cut before its manifest
    for n in (1, 2, 3):  # the trainers' checkpoints
        (tmp_path / f"step-{n}").mkdir()
        (tmp_path / f"step-{n}" / TRAINER_STATE).write_text("{}")
    (tmp_path / "step-0").mkdir()

    deleted = prune_step_folders(tmp_path, 3, 2, MANIFEST_LAYOUT)  # as dcp_io.save_checkpoint prunes
    assert [p.name for p in deleted] == ["step-00000000", "step-00000002"]  # 1 and 3 are the newest complete
    deleted = prune_checkpoints(tmp_path, 3, 2)  # as the trainer's loop and the pipelined runtime prune
    assert [p.name for p in deleted] == ["step-0", "step-1"]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["step-00000001", "step-00000003", "step-2", "step-3"]
