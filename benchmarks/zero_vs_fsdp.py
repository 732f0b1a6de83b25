"""tensoropt's ZeRO-3 plans against FSDP2 (``fully_shard``) and DDP on the same module, 2 gloo processes.

What a user would run instead of a ZeRO-3 plan is PyTorch's FSDP: ``fully_shard`` on every
transformer block, then on the root (torchtitan's recipe), AdamW. For each HF model (GPT-2 and
Llama built from configs at width ``--width``, nothing downloaded) the job is planned at 2 devices
with ``memory_options: [zero3]``; two of its frontier plans run through ``tensoropt.parallelize`` with a
stock ``torch.optim.AdamW``:

* ``zero3-dp``: the data-parallel plan with ``zero3`` on every operator that has parameters
  (:func:`tensoropt.baselines.data_parallel_plan_json`): FSDP's own layout, priced by the planner
  (it is usually dominated, so not on the frontier);
* ``fastest``: the frontier's fastest plan (with ``zero3`` where the solver chose it).

Against them, on the module the same job builds (the executor's seeded initial weights) and the
same global batches (each rank its rows): ``fsdp`` (``fully_shard`` per block and root) and
``ddp`` (``DistributedDataParallel``). One launch, every system alive; each step runs every system
once, in an order rotated step by step, behind a barrier, so the machine's drift hits each alike.

Memory per system is the high-water mark of live tensor bytes during one extra step
(:class:`tensoropt.executor.state.tensor_peak.TensorPeak`, the CPU counterpart of
``max_memory_allocated``): the system's own state (local parameter shards, optimizer state) plus
what its step allocates (gathered parameters, activations, gradients, communication buffers).
The process's resident peak cannot be split between systems that live in one process; it is not
reported here. The first-step losses of the four systems are printed side by side (same weights,
same batch: they agree to float32 rounding).

Usage: ``.venv/bin/python benchmarks/zero_vs_fsdp.py [--models gpt2,llama] [--width 256]
[--layers 4] [--seq 128] [--vocab 4096] [--batch 8] [--steps 12] [--json OUT]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from worker_launch import launch_workers, run_worker_if_asked  # noqa: E402

ROOT = HERE.parent
NPROC = 2


def sized_job(model: str, width: int, layers: int, seq: int, vocab: int, batch: int):
    """configs/jobs/hf-<model>.yaml at 2 devices, resized, AdamW, ``memory_options: [zero3]``.

    Example:
        >>> sized_job("gpt2", 64, 2, 16, 128, 4).model.kwargs["n_embd"]
        64
    """
    from tensoropt.config import load_job

    job = load_job(ROOT / "configs" / "jobs" / f"hf-{model}.yaml")
    kwargs = dict(job.model.kwargs)
    if model == "gpt2":
        kwargs.update(n_layer=layers, n_embd=width, n_head=max(1, width // 64), n_positions=seq,
                      vocab_size=vocab)
    else:
        heads = max(2, width // 64)
        kwargs.update(num_hidden_layers=layers, hidden_size=width, num_attention_heads=heads,
                      num_key_value_heads=heads // 2, intermediate_size=int(width * 8 / 3) // 8 * 8,
                      vocab_size=vocab, max_position_embeddings=seq)
    inputs = {name: {**spec, "shape": [seq], "high": vocab} for name, spec in job.model.inputs.items()}
    model_config = dataclasses.replace(job.model, kwargs=kwargs, inputs=inputs)
    training = dataclasses.replace(job.training, global_batch_size=batch, optimizer="adamw",
                                   memory_options=["zero3"])
    return dataclasses.replace(job, model=model_config, training=training, devices=[NPROC])


def pick_plans(job) -> dict[str, dict]:
    """plan.json documents of the job's 2-device frontier: ``zero3-dp`` and ``fastest`` (see the module doc).

    Example:
        >>> sorted(pick_plans(sized_job("gpt2", 64, 2, 16, 128, 4)))  # doctest: +SKIP
        ['fastest', 'zero3-dp']
    """
    from tensoropt.baselines import data_parallel_plan_json
    from tensoropt.planner import plan_job
    from tensoropt.plans import plan_file_text

    frontier = plan_job(job).to_json()
    fastest = min(frontier["frontiers"][0]["plans"], key=lambda p: p["time_s"])["id"]
    return {"zero3-dp": data_parallel_plan_json(job, NPROC, ("zero3",)),
            "fastest": json.loads(plan_file_text(frontier, fastest))}


def _blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks: the elements of the model's largest ``nn.ModuleList``."""
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []


def _state_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (DTensors counted by their local shard)."""
    from torch.distributed.tensor import DTensor

    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if isinstance(t, DTensor) else t
        storage = local.untyped_storage()
        seen[storage._cdata] = storage.nbytes()
    return sum(seen.values())


def _optimizer_tensors(opt: torch.optim.Optimizer):
    for state in opt.state.values():
        yield from (v for v in state.values() if isinstance(v, torch.Tensor))


def _step(system: tuple, spec, index: int, rank: int, world: int) -> tuple[float, float]:
    """One training step of ``system`` (kind, model, optimizer) on global batch ``index``: (seconds, loss)."""
    from tensoropt.executor.job.data import synthetic_batch

    kind, model, opt = system
    batch = synthetic_batch(list(spec.inputs), spec.global_batch_size, spec.seed, index)
    start = time.perf_counter()
    if kind == "api":
        loss = model.train_step(dict(zip(model.input_names, batch)))
    else:
        loss = model(*[t.chunk(world)[rank] for t in batch])
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    value = float(loss.detach())  # DDP/FSDP: this rank's mean (both ranks hold as many rows)
    return time.perf_counter() - start, value


def worker(options: dict) -> None:
    """Rank side: every system of every model, step-interleaved; rank 0 writes the figures."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    import tensoropt
    from tensoropt.executor.job.spec import TrainSpec
    from tensoropt.executor.state.tensor_peak import TensorPeak
    from tensoropt.models.registry import load_factory

    tensoropt.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {}
    for name, case in options["cases"].items():
        docs = {label: json.loads(Path(path).read_text()) for label, path in case["plans"].items()}
        job = next(iter(docs.values()))["job"]
        spec = TrainSpec.from_job(job)
        systems = {}
        for label, doc in docs.items():
            with torch.device("meta"):
                model = load_factory(job["model"]["factory"])(**job["model"]["kwargs"])
            pm = tensoropt.parallelize(model, doc)
            opt = torch.optim.AdamW(pm.parameters(), lr=spec.lr)
            systems[label] = ("api", pm, opt)
        ddp = DistributedDataParallel(spec.build_model())
        systems["ddp"] = ("plain", ddp, torch.optim.AdamW(ddp.parameters(), lr=spec.lr))
        fsdp = spec.build_model()
        for block in _blocks(fsdp):
            fully_shard(block)
        fully_shard(fsdp)
        systems["fsdp"] = ("plain", fsdp, torch.optim.AdamW(fsdp.parameters(), lr=spec.lr))

        labels = list(systems)
        times = {label: [] for label in labels}
        first_loss = {}
        for index in range(options["steps"] + 2):
            shift = index % len(labels)
            for label in labels[shift:] + labels[:shift]:
                dist.barrier()
                time_s, loss = _step(systems[label], spec, index, rank, world)
                if index == 0:
                    first_loss[label] = loss
                if index >= 2:
                    times[label].append(time_s)
        peaks = {}
        for label in labels:
            kind, model, opt = systems[label]
            params = list(model.parameters())
            baseline = _state_bytes([*params, *_optimizer_tensors(opt)])
            dist.barrier()
            with TensorPeak(baseline_bytes=baseline) as peak:
                _step(systems[label], spec, options["steps"] + 2, rank, world)
            peaks[label] = {"state_bytes": baseline, "peak_tensor_bytes": peak.peak_bytes}
        losses = torch.tensor([first_loss[label] for label in labels])
        dist.all_reduce(losses)  # DDP/FSDP report their rank's mean: average the two
        for i, label in enumerate(labels):
            if systems[label][0] == "plain":
                first_loss[label] = float(losses[i]) / world
        results[name] = {"median_ms": {k: statistics.median(v) * 1e3 for k, v in times.items()},
                         "peaks": peaks, "first_loss": first_loss,
                         "plans": {k: {"time_s": d["time_s"], "memory_bytes": d["memory_bytes"]}
                                   for k, d in docs.items()}}
        systems.clear()
    if rank == 0:
        Path(options["out"]).write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """Plan each model, run the interleaved launch, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2,llama")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        cases = {}
        for model in args.models.split(","):
            job = sized_job(model, args.width, args.layers, args.seq, args.vocab, args.batch)
            plans = {}
            for label, doc in pick_plans(job).items():
                path = Path(tmp) / f"{model}-{label}.json"
                path.write_text(json.dumps(doc))
                plans[label] = str(path)
            cases[model] = {"plans": plans}
        load_before = os.getloadavg()[0]
        got = launch_workers(__file__, {"cases": cases, "steps": args.steps}, Path(tmp), NPROC,
                             timeout_s=3600)
        load_after = os.getloadavg()[0]
    print(f"HF models at width {args.width}, {args.layers} layers, seq {args.seq}, vocab {args.vocab}, "
          f"global batch {args.batch}; 2 gloo processes, {args.steps} steps each, interleaved; "
          f"load {load_before:.1f} -> {load_after:.1f}")
    print(f"{'model':6} {'system':9} {'step ms':>8} {'/ fsdp':>7} {'/ ddp':>6} {'peak MiB':>9} {'/ fsdp':>7} "
          f"{'state MiB':>9} {'pred MiB':>8} {'loss@0':>9}")
    for model, r in got.items():
        ms, peaks = r["median_ms"], r["peaks"]
        for label in ms:
            peak = peaks[label]["peak_tensor_bytes"] / 2**20
            pred = r["plans"].get(label, {}).get("memory_bytes")
            print(f"{model:6} {label:9} {ms[label]:8.1f} {ms[label] / ms['fsdp']:7.2f} "
                  f"{ms[label] / ms['ddp']:6.2f} "
                  f"{peak:9.1f} {peak / (peaks['fsdp']['peak_tensor_bytes'] / 2**20):7.2f} "
                  f"{peaks[label]['state_bytes'] / 2**20:9.1f} "
                  f"{(pred / 2**20 if pred else float('nan')):8.1f} {r['first_loss'][label]:9.5f}")
    if args.json:
        Path(args.json).write_text(json.dumps(got, indent=1))
    return 0


if __name__ == "__main__":
    run_worker_if_asked(worker)
    raise SystemExit(main())
