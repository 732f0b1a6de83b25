"""benchmarks/worker_launch.py, the one launch of the multi-process benchmarks: a script's worker
started on 2 processes gets its options and environment (and the benchmarks folder on its import
path), rank 0's figures come back, and a failing worker is an error naming the script."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from worker_launch import launch_workers, run_worker_if_asked  # noqa: E402

SCRIPT = textwrap.dedent("""\
    import json
    import os
    import sys
    from pathlib import Path

    from worker_launch import run_worker_if_asked  # found through the PYTHONPATH the launch sets


    def worker(options):
        if options.get("fail") and os.environ["RANK"] == "1":
            raise SystemExit(3)
        if os.environ["RANK"] == "0":
            Path(options["out"]).write_text(json.dumps({
                "doubled": options["x"] * 2, "world": int(os.environ["WORLD_SIZE"]),
                "probe": os.environ.get("PROBE")}))


    if __name__ == "__main__":
        run_worker_if_asked(worker)
        sys.exit(5)  # not reached by a worker
""")


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_workers_get_their_options_and_rank0_figures_come_back(tmp_path):
    script = tmp_path / "probe_bench.py"
    script.write_text(SCRIPT)
    got = launch_workers(script, {"x": 21}, tmp_path, nproc=2, timeout_s=180, env={"PROBE": "yes"})
    assert got == {"doubled": 42, "world": 2, "probe": "yes"}


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_a_failing_worker_names_the_script(tmp_path):
    script = tmp_path / "probe_bench.py"
    script.write_text(SCRIPT)
    with pytest.raises(RuntimeError, match=r"probe_bench\.py: benchmark workers failed"):
        launch_workers(script, {"x": 1, "fail": True}, tmp_path, nproc=2, timeout_s=180)


def test_a_process_not_started_as_a_worker_goes_on():
    seen = []
    run_worker_if_asked(seen.append, ["runtime.py", "--models", "gpt"])
    assert seen == []
