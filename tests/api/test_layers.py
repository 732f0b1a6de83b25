"""Layers point downward only: the import graph of frontier/, estimators/ and tensoropt/ (read with
ast, every import in a module, including those inside functions) has no cycle between packages,
and no package imports one of a higher layer (docs/architecture.md, "Layers")."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[2]
OURS = ("frontier", "estimators", "tensoropt")

LAYERS = {
    "frontier": 0,
    "estimators": 1,
    # tensoropt core: the job, the model zoo, capture, the configuration space, the cost graph
    "tensoropt.sizes": 2, "tensoropt.precision": 2, "tensoropt.progress": 2, "tensoropt.capture": 2,
    "tensoropt.models": 2, "tensoropt.configspace": 2, "tensoropt.config": 2, "tensoropt.cost_graph": 2,
    "tensoropt.job_model": 2, "tensoropt.accumulation": 2, "tensoropt.data_parallel": 2,
    "tensoropt.batch_norm_kernels": 2,  # batch-norm kernels: the executor runs, the cost graph times
    # planning and selection: plan/frontier files, the planner, the selector
    "tensoropt.plans": 3, "tensoropt.summary": 3, "tensoropt.solver_size": 3, "tensoropt.planner": 3,
    "tensoropt.selector": 3, "tensoropt.tables": 3, "tensoropt.baselines": 3, "tensoropt.pipeline": 3,
    "tensoropt.pipeline_candidate": 3,  # one pipeline's frontier through the planner (benchmarks, tests)
    "tensoropt.peak_transients": 3,  # a plan's step-order tensor peak: the planner's and the executor's
    # execution: the DTensor executor and its checkpoints
    "tensoropt.checkpoint": 4, "tensoropt.executor": 4,
    # pipelined plans' runtime: stage modules on torch.distributed.pipelining, over the executor's pieces
    "tensoropt.pipeline_runtime": 4,
    # starting processes
    "tensoropt.launch": 5, "tensoropt.elastic": 5,
    # the parallel model in your own training loop (tensoropt.parallelize), above the executor it runs
    "tensoropt.parallel": 5,
    # the trainer of `tensoropt run` (schedule, optimizer groups, metrics, its loop over tensoropt.parallel)
    "tensoropt.training": 5,
    # the command line
    "tensoropt.commands": 6, "tensoropt.cli": 6, "tensoropt.demo": 6, "tensoropt": 6,
}
"""Layer of each package (or top-level module of tensoropt); a package imports its own layer or lower."""

EXECUTOR_LAYERS = ("tensoropt.executor.job", "tensoropt.executor.ops", "tensoropt.executor.state",
                   "tensoropt.executor.program")
"""The executor's sub-packages, lowest first (docs/architecture.md, "The executor's layers"): what it
is given (plan, spec, data, the exported model), the operator implementations, a rank's state, the
step's program. A module of one imports only modules of its own sub-package or of one listed before."""

PLOT_READS = {"tensoropt.plans", "tensoropt.sizes"}
"""All that tensoropt/plot may import: it reads plan and frontier JSON only."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in OURS for p in sorted((ROOT / pkg).rglob("*.py"))}


def _imports(name: str, path: Path) -> list[tuple[str, int]]:
    """(imported name, line) of every import in the module, relative ones made absolute."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join(package + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            # "from pkg import name": pkg.name (a module, or an attribute resolved back to pkg)
            out += [(f"{base}.{a.name}" if a.name != "*" else base, node.lineno) for a in node.names]
    return out


def _unit(module: str) -> str:
    """The package a module belongs to for layering: frontier, estimators, tensoropt.<first part>."""
    parts = module.split(".")
    return parts[0] if parts[0] != "tensoropt" or len(parts) == 1 else f"tensoropt.{parts[1]}"


def _edges() -> list[tuple[str, str, str, int]]:
    """(importing unit, imported unit, importing module, line) between different units of ours.

    A name is resolved to the longest module or package (namespace packages included) it names.
    """
    modules = _modules()
    known = set(modules) | {m.rsplit(".", i)[0] for m in modules for i in range(1, m.count(".") + 1)}
    edges = set()
    for name, path in modules.items():
        for target, line in _imports(name, path):
            while target and target not in known:  # "pkg.mod.Name" -> "pkg.mod"
                target = target.rpartition(".")[0]
            if target and _unit(target) != _unit(name):
                edges.add((_unit(name), _unit(target), name, line))
    return sorted(edges)


def test_every_package_has_a_layer():
    units = {_unit(m) for m in _modules()} - {"tensoropt.plot"}
    missing = sorted(units - set(LAYERS))
    assert not missing, (f"{missing}: give each a layer in LAYERS here and in docs/architecture.md's "
                         "layer diagram")


def test_no_cycle_between_packages():
    graph = nx.DiGraph((u, v) for u, v, _, _ in _edges())
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, f"package import cycles: {cycles[:5]}"


def test_imports_point_downward():
    upward = [f"{module}:{line} ({u}, layer {LAYERS[u]}) imports {v} (layer {LAYERS[v]})"
              for u, v, module, line in _edges() if u in LAYERS and v in LAYERS and LAYERS[v] > LAYERS[u]]
    assert not upward, "imports of a higher layer:\n" + "\n".join(upward)


def test_plot_reads_plan_and_frontier_files_only():
    extra = [f"{module}:{line} imports {v}" for u, v, module, line in _edges()
             if u == "tensoropt.plot" and v not in PLOT_READS]
    assert not extra, "tensoropt/plot imports more than the plan/frontier JSON layer:\n" + "\n".join(extra)


def test_solver_and_cost_model_stay_free_of_the_system():
    modules = _modules()
    found = []
    banned_by_unit = {"frontier": ("torch", "tensoropt", "estimators"), "estimators": ("tensoropt",)}
    for name, path in modules.items():
        banned = banned_by_unit.get(_unit(name))
        for target, line in _imports(name, path) if banned else ():
            if target.split(".")[0] in banned:
                found.append(f"{name}:{line} imports {target}")
    assert not found, "frontier/ must import neither torch nor tensoropt (nor estimators); " \
                      "estimators/ must not import tensoropt:\n" + "\n".join(found)


def test_the_check_sees_an_upward_import(tmp_path):
    """The parser finds imports inside functions and resolves relative ones (what the checks rely on)."""
    path = tmp_path / "mod.py"
    path.write_text("def f():\n    from ..planner import plan_job\n    import torch.nn\n")
    found = _imports("tensoropt.executor.mod", path)
    assert ("tensoropt.planner.plan_job", 2) in found and ("torch.nn", 3) in found



def _executor_layer(module: str) -> int | None:
    """Index in EXECUTOR_LAYERS of the executor sub-package a module belongs to (None: not in one)."""
    parts = module.split(".")
    package = ".".join(parts[:3])
    return EXECUTOR_LAYERS.index(package) if parts[:2] == ["tensoropt", "executor"] \
        and package in EXECUTOR_LAYERS else None


def _executor_upward(modules: dict[str, Path]) -> list[str]:
    """Imports, among the given executor modules, of a higher executor sub-package than the importer's."""
    known = set(_modules()) | set(modules)
    known |= {m.rsplit(".", i)[0] for m in known for i in range(1, m.count(".") + 1)}
    found = []
    for name, path in modules.items():
        own = _executor_layer(name)
        for target, line in _imports(name, path) if own is not None else ():
            while target and target not in known:  # "pkg.mod.Name" -> "pkg.mod"
                target = target.rpartition(".")[0]
            theirs = _executor_layer(target)
            if theirs is not None and theirs > own:
                found.append(f"{name}:{line} ({EXECUTOR_LAYERS[own]}) imports {target} "
                             f"({EXECUTOR_LAYERS[theirs]})")
    return found


def test_every_executor_module_sits_in_a_sub_package():
    loose = sorted(m for m in _modules()
                   if m.startswith("tensoropt.executor.") and _executor_layer(m) is None)
    assert not loose, (f"{loose}: move each into one of {EXECUTOR_LAYERS} (or add a sub-package to "
                       "EXECUTOR_LAYERS here and to docs/architecture.md)")


def test_executor_sub_packages_point_downward():
    executor = {m: p for m, p in _modules().items() if m.startswith("tensoropt.executor.")}
    upward = _executor_upward(executor)
    assert not upward, "executor imports of a higher sub-package:\n" + "\n".join(upward)


def test_the_executor_check_sees_an_upward_import(tmp_path):
    """An op importing the replayed program (inside a function, relatively) is found; the reverse is not."""
    low, high = tmp_path / "low.py", tmp_path / "high.py"
    low.write_text("def f():\n    from ..program.replay import ReplayProgram\n")
    high.write_text("from tensoropt.executor.ops.placements import to_placements\n")
    found = _executor_upward({"tensoropt.executor.ops.low": low, "tensoropt.executor.program.high": high})
    assert found == ["tensoropt.executor.ops.low:2 (tensoropt.executor.ops) imports "
                     "tensoropt.executor.program.replay (tensoropt.executor.program)"], found
