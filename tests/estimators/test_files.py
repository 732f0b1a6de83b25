"""estimators.files: atomic writes keep permissions without touching the umask; merges under a lock."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import stat
import subprocess
import sys

import pytest

from estimators.files import file_lock, merge_json_file, read_json_object, write_text_atomic

WRITERS = 4
ENTRIES_PER_WRITER = 25


def _merge_many(path: str, writer: int) -> None:
    """One process: merge ENTRIES_PER_WRITER entries, one at a time (each a read-merge-write)."""
    for i in range(ENTRIES_PER_WRITER):
        merge_json_file(path, {f"w{writer}-{i}": [writer, i]})


def test_processes_merging_one_cache_lose_no_entries(tmp_path):
    path = str(tmp_path / "cache.json")
    merge_json_file(path, {"before": [0, 0]})
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_merge_many, args=(path, w)) for w in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0, f"writer {p.pid} exited with {p.exitcode}"
    data = json.loads(open(path).read())
    expected = {"before"} | {f"w{w}-{i}" for w in range(WRITERS) for i in range(ENTRIES_PER_WRITER)}
    assert set(data) == expected
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")], "temporary files left behind"


def test_lock_is_exclusive_between_processes(tmp_path):
    path = tmp_path / "cache.json"
    code = ("from estimators.files import merge_json_file; print('ready', flush=True); "
            f"merge_json_file({str(path)!r}, {{'child': 1}})")
    with file_lock(path):  # a fresh process: a forked one would share this lock's open file
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "ready"  # imported; about to merge
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=1.0)  # blocked on the lock
        assert not path.exists()
    assert child.wait(timeout=60) == 0
    assert read_json_object(path) == {"child": 1}


def test_new_file_gets_the_umask_and_the_umask_is_left_alone(tmp_path):
    old = os.umask(0o027)
    try:
        write_text_atomic(tmp_path / "a.json", "{}")
        assert os.umask(0o027) == 0o027  # the write did not change the process umask
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "a.json").st_mode) == 0o640


def test_existing_file_keeps_its_permissions(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("old")
    os.chmod(path, 0o600)
    write_text_atomic(path, "new")
    assert path.read_text() == "new"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_torn_or_foreign_file_reads_as_empty_and_is_replaced_by_a_merge(tmp_path):
    path = tmp_path / "cache.json"
    path.write_text('{"a": [1')  # torn
    assert read_json_object(path) == {}
    path.write_text("[1, 2]")  # not an object
    assert merge_json_file(path, {"b": 1}) == {"b": 1}
    assert json.loads(path.read_text()) == {"b": 1}
