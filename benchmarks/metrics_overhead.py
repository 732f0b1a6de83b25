"""What logging every step costs (issue 25: <= 2 % of step time), and that metrics.jsonl is readable
while the run goes.

Trains configs/jobs/hf-gpt2-train.yaml's model (tiny HF GPT-2, 1 process, its 1-device plan, 2
micro-batches, clipping, warmup + cosine) with the trainer's loop for ``--steps`` steps, logging
every step (metrics.jsonl, TensorBoard, progress line), and reads the median step time from the
records. Then times the logging path itself, the same calls the loop makes per logged step
(``step_record``, ``MetricsLogger.log`` with TensorBoard, ``ProgressLine.update``), over ``--calls``
calls into the same kinds of files, interleaved with reading the JSONL back (each line a complete
object). Prints one table: median step, logging per step, the ratio.

Usage::

    .venv/bin/python benchmarks/metrics_overhead.py [--steps 30] [--calls 300]
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import yaml

from tensoropt.config import Job
from tensoropt.planner import plan_job
from tensoropt.plans import plan_file_text
from tensoropt.tables import format_table
from tensoropt.training.loop import train
from tensoropt.training.metrics import MetricsLogger, ProgressLine, TensorBoardWriter, step_record

REPO = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="metrics-overhead-"))
    data = yaml.safe_load((REPO / "configs" / "jobs" / "hf-gpt2-train.yaml").read_text())
    data["training"].update(steps=args.steps, micro_batches=2)
    data["lr_scheduler"].update(warmup_steps=5, decay_steps=args.steps - 5)
    data.update(devices=[1], metrics={"log_every": 1, "jsonl": str(tmp / "metrics.jsonl"),
                                      "tensorboard": str(tmp / "tb")})
    data.pop("validation")
    data["checkpoint"] = {}
    job = Job.from_dict(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        frontier = plan_job(job).to_json()
        plan = json.loads(plan_file_text(frontier, frontier["frontiers"][0]["plans"][0]["id"]))
        records = train(job, plan, out_dir=tmp, stream=io.StringIO())
    step_s = statistics.median(r["time_s"] for r in records[3:])
    logger = MetricsLogger(tmp / "bench.jsonl", tensorboard=TensorBoardWriter(tmp / "tb-bench"))
    bar = ProgressLine(args.calls, stream=io.StringIO())
    costs = []
    for i in range(args.calls):
        start = time.perf_counter()
        record = step_record(step=i + 1, loss=3.0, lr=1e-3, grad_norm=0.5, time_s=step_s, samples=16,
                             tokens=512, flops=1e9, peak_flops=1e12, devices=1, peak_bytes=1 << 30)
        logger.log(record)
        bar.update(i + 1, loss=3.0, lr=1e-3)
        costs.append(time.perf_counter() - start)
        if i % 50 == 0:  # readable while written: every line one complete object
            lines = (tmp / "bench.jsonl").read_text().splitlines()
            assert len(lines) == i + 1 and all(json.loads(line) for line in lines)
    logger.close()
    log_s = statistics.median(costs)
    rows = [[f"{step_s * 1e3:.2f}", f"{log_s * 1e6:.0f}", f"{100 * log_s / step_s:.2f} %",
             len(records), len((tmp / "metrics.jsonl").read_text().splitlines())]]
    print(format_table(["median step ms", "logging us/step", "logging / step", "steps", "jsonl lines"], rows,
                       right=[0, 1, 2, 3, 4]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
