"""What a worker's start-up costs: the import of each worker entry, a 2-process ``tensoropt run`` of
the demo's job (command to first step, and total) and one test, for one or more checkouts, interleaved.

Usage::

    python benchmarks/startup.py --root /tmp/before --root . --rounds 3 --out out/startup.json
    python benchmarks/startup.py --root . --rounds 1 --no-run --test ''        # imports only

Each figure is wall seconds beside CPU seconds (user + sys of the child and everything it waited
for), with the 1-minute load average before and after: the machine is shared, so compare the
checkouts within one round. The run's first step is stamped by a ``sitecustomize`` put on the
workers' ``PYTHONPATH`` (it wraps ``StepMeter.step`` and writes the wall clock when step 0 starts);
every process of the run (launcher, torchrun's agent, workers) writes its ``sys.modules`` at exit to
``first-step.modules.<rank or launcher>.<pid>`` in the round's folder, to see what each one loaded.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENTRIES = (
    "tensoropt.training.worker",  # tensoropt run (plans without trainer keys), calibrate
    "tensoropt.training.loop",  # tensoropt run with trainer keys / --checkpoint-dir / --elastic
    "tensoropt.training.pipelined",  # tensoropt run of a pipelined plan
    "tensoropt.pipeline_runtime.worker",  # the pipelined benchmarks' worker
    "tensoropt.cli",  # the command line's module (`--help` imports every command: docs/results.md)
)
"""The modules torchrun starts (``python -m MODULE RUN.json``), and the CLI."""

HEAVY = ("numba", "networkx", "plotly", "pymoo", "scipy", "numpy", "transformers", "timm", "yaml",
         "frontier.pareto_scan", "frontier.driver", "tensoropt.planner", "tensoropt.cost_graph",
         "torch._dynamo", "torch._inductor", "sympy")
"""Modules whose presence after an import is reported (a worker needs few of them)."""

_HOOK = '''
import os, sys, time
_OUT = os.environ.get("STARTUP_FIRST_STEP_FILE")
if _OUT:
    import importlib.abc, importlib.machinery

    class _Stamp(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "tensoropt.training.measure":
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            exec_module = spec.loader.exec_module

            def patched(module):
                exec_module(module)
                step = module.StepMeter.step

                def stamped(self, *args, **kwargs):
                    if not getattr(module, "_stamped", False):
                        module._stamped = True
                        with open(_OUT + "." + os.environ.get("RANK", "0"), "w") as f:
                            f.write(repr(time.time()))
                    return step(self, *args, **kwargs)

                module.StepMeter.step = stamped
            spec.loader.exec_module = patched
            return spec

    sys.meta_path.insert(0, _Stamp())

    def _modules():
        with open(_OUT + ".modules." + os.environ.get("RANK", "launcher") + "." + str(os.getpid()), "w") as f:
            f.write("\\n".join(sorted(sys.modules)))

    import atexit
    atexit.register(_modules)
'''


def load_1min() -> float:
    """The 1-minute load average.

    Example:
        >>> load_1min() >= 0
        True
    """
    return os.getloadavg()[0]


def timed(cmd: list[str], cwd: Path, env: dict[str, str], timeout_s: float = 900) -> dict:
    """Run ``cmd``; its wall and CPU seconds (children's user + sys), exit code and load before/after.

    Example:
        >>> r = timed([sys.executable, "-c", "pass"], Path("."), dict(os.environ))
        >>> r["rc"], r["wall_s"] > 0
        (0, True)
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = load_1min()
    start = time.time()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
    wall_s = time.time() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"rc": proc.returncode, "wall_s": round(wall_s, 3), "cpu_s": round(cpu_s, 3), "start": start,
            "load": [round(load, 2), round(load_1min(), 2)], "stdout": proc.stdout, "stderr": proc.stderr}


def env_for(root: Path, extra: dict[str, str] | None = None, hook_dir: Path | None = None) -> dict[str, str]:
    """This environment with ``root`` (and ``hook_dir``) first on ``PYTHONPATH``."""
    paths = [str(hook_dir)] if hook_dir else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*paths, str(root)]), **(extra or {}))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def import_cost(module: str, root: Path) -> dict:
    """Wall and CPU seconds of ``python -c "import module"`` in ``root``, and which :data:`HEAVY`
    modules it left loaded."""
    code = (f"import sys, json; import {module}; "
            f"print(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))")
    r = timed([sys.executable, "-c", code], root, env_for(root))
    if r["rc"] != 0:
        raise RuntimeError(f"import {module} in {root} failed:\n{r['stderr'][-2000:]}")
    return {"wall_s": r["wall_s"], "cpu_s": r["cpu_s"], "load": r["load"],
            "heavy": json.loads(r["stdout"].strip().splitlines()[-1])}


def demo_run(root: Path, plan: Path, hook_dir: Path, out: Path) -> dict:
    """``tensoropt run configs/jobs/cpu-demo.yaml --plan PLAN --nproc 2 --steps 20`` in ``root``:
    wall and CPU seconds in all, and the wall seconds from the command to step 0's start."""
    stamp = out / "first-step"
    cmd = [sys.executable, "-c", "import sys; from tensoropt.cli import main; sys.exit(main())", "run",
           "configs/jobs/cpu-demo.yaml", "--plan", str(plan), "--nproc", "2", "--steps", "20",
           "--metrics", str(out / "metrics.json")]
    r = timed(cmd, root, env_for(root, {"STARTUP_FIRST_STEP_FILE": str(stamp)}, hook_dir))
    if r["rc"] != 0:
        raise RuntimeError(f"the demo run in {root} failed:\n{r['stdout'][-2000:]}\n{r['stderr'][-3000:]}")
    stamps = [float(p.read_text()) for p in out.glob("first-step.[0-9]*")]
    return {"wall_s": r["wall_s"], "cpu_s": r["cpu_s"], "load": r["load"],
            "to_first_step_s": round(max(stamps) - r["start"], 3) if stamps else None}


def test_run(root: Path, test: str) -> dict:
    """``pytest -q -x TEST`` in ``root``: wall and CPU seconds, and whether it passed."""
    r = timed([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", test], root,
              env_for(root), timeout_s=1500)
    return {"wall_s": r["wall_s"], "cpu_s": r["cpu_s"], "load": r["load"], "passed": r["rc"] == 0,
            "tail": r["stdout"].strip().splitlines()[-1:] if r["stdout"] else []}


def main(argv: list[str] | None = None) -> int:
    """Measure every root in turn, ``--rounds`` times; print one line per figure, write ``--out``."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", action="append", required=True, help="a checkout to measure (repeat)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--entries", default=",".join(ENTRIES), help="comma-separated modules to import")
    p.add_argument("--no-run", action="store_true", help="skip the 2-process demo run")
    p.add_argument("--plan", default=None, help="the demo job's 2-device plan.json (default: planned here)")
    p.add_argument("--test", default="tests/elastic/test_elastic_pipelined.py",
                   help="a test to time in each root ('' for none)")
    p.add_argument("--out", default=None, help="write every figure here (JSON)")
    args = p.parse_args(argv)
    roots = [Path(r).resolve() for r in args.root]
    work = Path(tempfile.mkdtemp(prefix="startup-"))
    print(f"work folder {work}", flush=True)
    (work / "sitecustomize.py").write_text(_HOOK)
    plan = Path(args.plan).resolve() if args.plan else None
    if not args.no_run and plan is None:  # the demo's plan, made once (by the first root), run by every root
        rc = subprocess.run([sys.executable, "-c", "import sys; from tensoropt.cli import main; "
                             "sys.exit(main())", "plan", "configs/jobs/cpu-demo.yaml", "--out",
                             str(work / "plan")], cwd=roots[0], env=env_for(roots[0]),
                            capture_output=True, text=True).returncode
        plan = work / "plan" / "plan.json"
        if rc not in (0, 2) or json.loads(plan.read_text()).get("devices") != 2:
            raise RuntimeError(f"planning the demo's job gave exit code {rc} or no 2-device plan")
    for root in roots:  # warm the byte-code caches (a fresh checkout compiles every module once)
        for module in args.entries.split(","):
            import_cost(module, root)
    rows = []
    for round_ in range(args.rounds):
        for root in roots:
            row = {"round": round_, "root": str(root), "imports": {}}
            for module in args.entries.split(","):
                row["imports"][module] = cost = import_cost(module, root)
                print(f"round {round_} {root.name}: import {module}: {cost['wall_s']:.2f} s wall, "
                      f"{cost['cpu_s']:.2f} s CPU, load {cost['load']}, heavy {cost['heavy']}", flush=True)
            if plan is not None:
                out = work / f"run-{round_}-{roots.index(root)}"
                out.mkdir()
                row["demo_run"] = r = demo_run(root, plan, work, out)
                print(f"round {round_} {root.name}: demo run: {r['wall_s']:.1f} s wall, "
                      f"{r['cpu_s']:.1f} s CPU, first step at {r['to_first_step_s']} s, load {r['load']}",
                      flush=True)
            if args.test:
                row["test"] = r = test_run(root, args.test)
                print(f"round {round_} {root.name}: {args.test}: {r['wall_s']:.1f} s wall, "
                      f"{r['cpu_s']:.1f} s CPU, passed {r['passed']}, load {r['load']} {r['tail']}",
                      flush=True)
            rows.append(row)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
