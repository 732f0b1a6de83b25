"""The profiled timing cache's merge (estimators.files.merge_json_file): cost per merge and entries kept.

Run: ``.venv/bin/python benchmarks/cache_merge.py [--entries 500] [--merges 50] [--processes 4]``

Prints the time of one read-merge-write of a cache of ``--entries`` entries, written without fsync
(as the cache is) and with it (as plan files are), and how many of ``--processes`` x 25 entries
merged by processes at once survive, with the file lock and without it. Records the load average.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import tempfile
import time
from unittest import mock

import estimators.files as files


def _merge_s(path: str, entries: int, merges: int, fsync: bool) -> float:
    """Seconds per merge, the write fsynced or not."""
    cache = {f"k{i}": [1e-4, 2e-4] for i in range(entries)}
    write = files.write_text_atomic
    with mock.patch.object(files, "write_text_atomic", lambda p, t, durable=True: write(p, t, fsync)):
        start = time.perf_counter()
        for i in range(merges):
            cache = files.merge_json_file(path, {**cache, f"new{i}": [1.0, 2.0]})
        return (time.perf_counter() - start) / merges


def _writer(path: str, writer: int, locked: bool) -> None:
    lock = files.file_lock if locked else (lambda p: contextlib.nullcontext())
    with mock.patch.object(files, "file_lock", lock):
        for i in range(25):
            files.merge_json_file(path, {f"w{writer}-{i}": 1})


def _kept(processes: int, locked: bool) -> int:
    path = os.path.join(tempfile.mkdtemp(), "cache.json")
    procs = [mp.get_context("fork").Process(target=_writer, args=(path, w, locked)) for w in range(processes)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return len(json.loads(open(path).read()))


def main() -> None:
    """Print the figures."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=500)
    parser.add_argument("--merges", type=int, default=50)
    parser.add_argument("--processes", type=int, default=4)
    args = parser.parse_args()
    load = os.getloadavg()
    folder = tempfile.mkdtemp()
    for fsync in (False, True):
        ms = _merge_s(os.path.join(folder, f"c{fsync}.json"), args.entries, args.merges, fsync) * 1e3
        print(f"merge into {args.entries} entries, {'with' if fsync else 'without'} fsync: {ms:.2f} ms")
    total = args.processes * 25
    for locked in (True, False):
        print(f"{args.processes} processes x 25 merges, {'with' if locked else 'without'} the lock: "
              f"{_kept(args.processes, locked)} of {total} entries kept")
    print(f"load average before {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, after "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
