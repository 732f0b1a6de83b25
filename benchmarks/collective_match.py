"""A plan's priced collectives against its replayed program's, one by one (issue 29 item 4, whole step).

The cost graph prices every collective whose result the next operator waits for at its fit plus a
sync point (:meth:`estimators.collectives.CommModel.blocking_time_s`); the replayed program
(:mod:`tensoropt.executor.program.lowering`) issues its own. This lists both for each plan of
``benchmarks/fidelity.py`` (its plan cache: the same plans) and matches them:

* priced: :func:`estimators.priced_collectives.priced_collectives` (kind, ``n`` bytes, blocking or at
  its fit, the operator whose cost or incoming edge holds it, forward / backward);
* run: each collective of the traced program of rank 0 (:func:`program_collectives`): kind, bytes,
  the operator of the plan whose forward or backward issued it (the trace is stamped at each
  interpreter node and at the gradient of each node's output: :class:`Attribution`), the operator
  that reads its wait, the program operators between its issue and its wait, a gradient bucket or
  not;
* matched per operator on (kind, bytes), then what is left across operators; what is still left
  is printed (the differences).

Usage (one command): ``TENSOROPT_CACHE=... .venv/bin/python benchmarks/collective_match.py
--plan-cache plans.json [--models decoder,encoder,vit,cnn] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent



class Attribution:
    """While active, stamps every ``make_fx`` trace of a :class:`PlanInterpreter` step: at the start of
    each plan node's forward and when its output's gradient is computed (its backward starts), the
    trace's last node; :attr:`order` is the traced program's node order before any pass moves nodes.

    Example:
        >>> with Attribution() as att:  # doctest: +SKIP
        ...     trainer.train(2)
        >>> owner_of(att, "all_gather_into_tensor_3")  # doctest: +SKIP
        ('layer_norm_1', 'forward')
    """

    def __enter__(self):
        from tensoropt.executor.program import interpreter, lowering

        self.marks: list[tuple[str | None, str, str]] = []
        self.order: list[str] = []
        self.trace_marks: list[tuple[str | None, str, str]] = []
        self._interp, self._lowering = interpreter.PlanInterpreter, lowering
        self._run_node, self._defer = interpreter.PlanInterpreter.run_node, lowering.defer_waits
        att = self

        def run_node(interp, n):
            mode = _proxy_mode()
            if mode is None or n.op != "call_function" or interp.mesh is None:
                return att._run_node(interp, n)
            att.marks.append((_last(mode), n.name, "forward"))
            out = att._run_node(interp, n)
            for t in _tensors(out):
                if t.requires_grad:
                    t.register_hook(lambda _g, name=n.name: att._grad_mark(name))
            return out

        def defer_waits(gm):
            att.order = [n.name for n in gm.graph.nodes]
            att.trace_marks, att.marks = att.marks, []
            return att._defer(gm)

        interpreter.PlanInterpreter.run_node = run_node
        lowering.defer_waits = defer_waits
        return self

    def _grad_mark(self, name: str) -> None:
        mode = _proxy_mode()
        if mode is not None:
            self.marks.append((_last(mode), name, "backward"))

    def __exit__(self, *exc):
        self._interp.run_node = self._run_node
        self._lowering.defer_waits = self._defer
        return False


def _proxy_mode():
    from torch.fx.experimental.proxy_tensor import get_proxy_mode

    return get_proxy_mode()


def _last(mode) -> str | None:
    nodes = mode.tracer.graph.nodes
    return next(reversed(nodes)).name if len(nodes) else None


def _tensors(out) -> list:
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for t in out if isinstance(t, torch.Tensor)]
    return []


def owner_of(att: Attribution, name: str, position: dict[str, int] | None = None) -> tuple[str, str]:
    """(plan node, ``forward`` / ``backward``) whose part of the trace made program node ``name``
    (``("-", "-")`` before the first stamp or for a node a pass made)."""
    position = position or {n: i for i, n in enumerate(att.order)}
    if name not in position:
        return "-", "-"
    at = [position.get(m[0], -1) if m[0] is not None else -1 for m in att.trace_marks]
    i = bisect.bisect_left(at, position[name]) - 1  # the last stamp made before this node was traced
    return (att.trace_marks[i][1], att.trace_marks[i][2]) if i >= 0 else ("-", "-")


def program_collectives(gm, att: Attribution) -> list[dict]:
    """Each collective of the traced program ``gm`` (the lowered step, after its passes) in program
    order: ``node``, ``kind``, ``bytes`` (the estimator's ``n``), ``owner`` and ``phase`` (who issued
    it, :func:`owner_of`), ``reader`` (the plan node whose part of the program first reads its wait;
    ``output``: only the program's result), ``between`` (program operators between issue and wait),
    ``bucket`` (a gradient bucket) and ``hidden`` (:func:`hidden`).

    Example:
        >>> program_collectives(lowered.gm, att)[0]["kind"]  # doctest: +SKIP
        'all_gather'
    """
    import torch.fx as fx
    from comm_clock import _nbytes, collective_kind, gradient_bucket, is_wait

    position = {n: i for i, n in enumerate(att.order)}
    nodes = list(gm.graph.nodes)
    where = {n: i for i, n in enumerate(nodes)}
    rows = []
    for n in nodes:
        if n.op != "call_function":
            continue
        kind = collective_kind(n.target)
        if kind is None:
            continue
        vals = fx.node.map_arg(n.args, lambda a: a.meta.get("val"))
        waits = [u for u in n.users if is_wait(u.target)]
        wait = min(waits, key=where.__getitem__) if waits else None
        readers = sorted((u for u in wait.users), key=where.__getitem__) if wait is not None else []
        first = readers[0] if readers else None
        if first is None or first.op == "output":
            reader = "output"
        else:
            later = [m for m in nodes[where[first]:] if m.name in position]
            reader = "/".join(owner_of(att, later[0].name, position)) if later else "-"
        end = where[wait] if wait is not None else where[n]
        between = sum(1 for m in nodes[where[n] + 1:end] if m.op == "call_function"
                      and collective_kind(m.target) is None and not is_wait(m.target))
        owner, phase = owner_of(att, n.name, position)
        bucket = gradient_bucket(n)
        rows.append({"node": n.name, "kind": kind, "bytes": _nbytes(kind, vals, None), "owner": owner,
                     "phase": phase, "reader": reader, "between": between, "bucket": bucket,
                     "hidden": not bucket and hidden(n, wait, between)})
    return rows


OVERLAP_OPS = 20
"""A collective whose result only the program's outputs read counts as hidden from this many program
operators between its issue and its wait (the step's other work runs meanwhile)."""


def hidden(collective, wait, between: int) -> bool:
    """Whether nothing of the step waits for ``collective`` (the cost graph prices it without a sync
    point): its waited result only reaches the outputs or in-place writes into graph inputs through a
    few pure operators, with at least :data:`OVERLAP_OPS` operators run between its issue and its wait
    (the loss's value and gathered running statistics, which
    :func:`~tensoropt.executor.program.graph_passes.sink_waits` moves to the end; a gradient only a
    parameter's gradient reads); or it is a small all-reduce fed by integer graph inputs through a few
    pure operators (the label count :func:`~tensoropt.executor.program.graph_passes.hoist_collectives`
    issues early).

    Example:
        >>> import torch
        >>> g = torch.fx.Graph(); y = g.placeholder("labels"); y.meta["val"] = torch.ones(4, dtype=torch.long)
        >>> r = g.call_function(torch.ops._c10d_functional.all_reduce.default, (y, "sum", "0"))
        >>> w = g.call_function(torch.ops._c10d_functional.wait_tensor.default, (r,))
        >>> x = g.call_function(torch.ops.aten.mm.default, (w, w)); _ = g.output(x)
        >>> r.meta["val"] = torch.empty(4)
        >>> hidden(r, w, 0)  # a count of labels: the kind hoisted
        True
    """
    import torch

    from tensoropt.executor.program import graph_passes as gp

    if wait is not None and between >= OVERLAP_OPS and gp._cone(wait, forward=True, writes=True) is not None:
        return True
    val = collective.meta.get("val")
    small = isinstance(val, torch.Tensor) and val.numel() * val.element_size() <= gp.MAX_HOISTED_BYTES
    if collective.target is not torch.ops._c10d_functional.all_reduce.default or not small:
        return False
    cone = gp._cone(collective, forward=False)
    if cone is None:
        return False
    inputs = {a for n in [*cone, collective] for a in n.all_input_nodes if a.op == "placeholder"}
    return all(not (isinstance(a.meta.get("val"), torch.Tensor) and a.meta["val"].is_floating_point())
               for a in inputs)  # counted from integer inputs only (labels), not from the model's values


def match(priced: list[dict], run: list[dict]) -> dict:
    """Pair priced blocking collectives with the program's blocking ones: first per owner on (kind,
    bytes), then across owners on (kind, bytes); ``{"pairs", "priced_only", "run_only"}``.

    Example:
        >>> p = [{"kind": "all_reduce", "bytes": 64.0, "owner": "bn", "blocking": True}]
        >>> r = [{"kind": "all_reduce", "bytes": 64.0, "owner": "bn", "bucket": False, "hidden": False},
        ...      {"kind": "all_gather", "bytes": 8.0, "owner": "bn", "bucket": False, "hidden": False}]
        >>> m = match(p, r)
        >>> len(m["pairs"]), len(m["priced_only"]), [x["kind"] for x in m["run_only"]]
        (1, 0, ['all_gather'])
    """
    todo_p = [r for r in priced if r["blocking"]]
    todo_r = [r for r in run if not r["bucket"] and not r["hidden"]]
    pairs = []
    for same_owner in (True, False):
        left = []
        for p in todo_p:
            hit = next((r for r in todo_r if r["kind"] == p["kind"] and abs(r["bytes"] - p["bytes"]) < 1
                        and (not same_owner or r["owner"] == p["owner"])), None)
            if hit is None:
                left.append(p)
            else:
                todo_r.remove(hit)
                pairs.append((p, hit, same_owner))
        todo_p = left
    return {"pairs": pairs, "priced_only": todo_p, "run_only": todo_r}


def worker(options: dict) -> None:
    """torchrun entry: each plan traced once (two steps) under :class:`Attribution`; rank 0 writes its
    program's collectives."""
    import torch.distributed as dist
    from fidelity import MODELS
    from runtime import spec_of

    from tensoropt.executor.job.plan import ExecPlan
    from tensoropt.executor.state.worker import end_process_group, init_process_group
    from tensoropt.training.trainer import Trainer

    init_process_group()
    out: dict[str, list] = {}
    for key, plan in options["plans"].items():
        name = key.split("/")[0]
        trainer = Trainer(spec_of(name, 4, MODELS), ExecPlan.from_json(plan), mode="replay")
        with Attribution() as att:
            trainer.train(2, start_step=0)
        lowered = list(trainer.graph.program.programs.values())[-1][0]
        out[key] = program_collectives(lowered.gm, att)
        dist.barrier()
    if dist.get_rank() == 0:
        Path(options["out"]).write_text(json.dumps(out))
    end_process_group()


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.3f}"


def print_plan(key: str, priced: list[dict], run: list[dict]) -> dict:
    """Print one plan's two lists, their matching and the counts; returns the counts."""
    m = match(priced, run)
    blocking_run = [r for r in run if not r["bucket"] and not r["hidden"]]
    counts = {"priced_blocking": sum(1 for p in priced if p["blocking"]),
              "priced_fit": sum(1 for p in priced if not p["blocking"] and p["phase"] != "grad"),
              "run_blocking": len(blocking_run), "run_hidden": sum(1 for r in run if r["hidden"]),
              "run_buckets": sum(1 for r in run if r["bucket"]), "matched": len(m["pairs"]),
              "matched_other_owner": sum(1 for *_, same in m["pairs"] if not same),
              "priced_only": len(m["priced_only"]), "run_only": len(m["run_only"])}
    print(f"\n== {key}: priced blocking {counts['priced_blocking']} (+{counts['priced_fit']} at the fit), "
          f"run blocking {counts['run_blocking']} (+{counts['run_hidden']} hidden, {counts['run_buckets']} "
          f"buckets); matched {counts['matched']} ({counts['matched_other_owner']} on another operator)")
    print("  run (program order): node kind MiB owner/phase -> reader, ops between")
    for r in run:
        tag = "bucket" if r["bucket"] else "hidden" if r["hidden"] else ""
        print(f"    {r['node']:34} {r['kind']:14} {_mib(r['bytes']):>8} {r['owner'] + '/' + r['phase']:44} "
              f"-> {r['reader']:40} {r['between']:4d} {tag}")
    print("  priced (non-gradient): kind MiB owner <- edge phase blocking")
    for p in priced:
        if p["phase"] == "grad":
            continue
        print(f"    {p['kind']:14} {_mib(p['bytes']):>8} {p['owner']:36} <- {str(p['edge']):36} "
              f"{p['phase']:9} {'blocking' if p['blocking'] else 'fit'}")
    for what in ("priced_only", "run_only"):
        rows = m[what]
        print(f"  {what}: {len(rows)}")
        for r in rows:
            where = f"{r['owner']} <- {r.get('edge')} {r['phase']}" if what == "priced_only" else \
                f"{r['node']} {r['owner']}/{r['phase']} -> {r['reader']}"
            print(f"    {r['kind']:14} {_mib(r['bytes']):>8} {where}")
    return counts


def main(argv: list[str] | None = None) -> int:
    """List and match the collectives of every plan of the plan cache's models."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan-cache", required=True, help="benchmarks/fidelity.py's --plan-cache file")
    parser.add_argument("--models", default="decoder,encoder,vit,cnn")
    parser.add_argument("--cluster", default="cpu-local")
    parser.add_argument("--json", default=None, help="also write both lists and the counts here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from fidelity import MODELS, NPROC
    from runtime import spec_of
    from worker_launch import launch_workers

    from estimators.configuration import Configuration, Mesh
    from estimators.priced_collectives import priced_collectives
    from tensoropt.capture import capture
    from tensoropt.executor.job.data import synthetic_batch

    cached = json.loads(Path(args.plan_cache).read_text())
    plans, priced = {}, {}
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        spec = spec_of(name, models=MODELS)
        batch = synthetic_batch(list(spec.inputs), spec.global_batch_size, spec.seed, 0)
        graph = capture(spec.build_model(), batch)
        for label in cached[name]["plans"]["run"]:
            plan = cached[name]["plans"][label]
            mesh = Mesh.from_json(plan["mesh"]) if "mesh" in plan else Mesh((NPROC,), ("gpu",))
            assignment = {n: Configuration.from_json(c) for n, c in plan["placements"].items()}
            priced[f"{name}/{label}"] = priced_collectives(graph.nx, args.cluster, mesh, assignment)
            plans[f"{name}/{label}"] = plan
    with tempfile.TemporaryDirectory() as tmp:
        run = launch_workers(__file__, {"plans": plans}, Path(tmp), timeout_s=1800)
    counts = {key: print_plan(key, priced[key], run[key]) for key in plans}
    print("\nplan             priced blocking  run blocking  matched  priced only  run only")
    for key, c in counts.items():
        print(f"{key:16} {c['priced_blocking']:15d} {c['run_blocking']:13d} {c['matched']:8d} "
              f"{c['priced_only']:12d} {c['run_only']:9d}")
    if args.json:
        Path(args.json).write_text(json.dumps({"priced": priced, "run": run, "counts": counts}, indent=1,
                                              default=str))
    return 0


if __name__ == "__main__":
    from worker_launch import run_worker_if_asked

    run_worker_if_asked(worker)
    sys.exit(main())
