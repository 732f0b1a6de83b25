"""tensoropt: multi-objective auto-parallel planner for PyTorch training.

The pipeline: model -> :func:`capture` (OpGraph) -> :func:`configurations` (per-operator
parallel configurations on a device mesh) -> :func:`cost_graph` (time/memory tables) ->
``frontier.solve`` (exact Pareto frontier) -> selector -> executor.

Public entry points are imported lazily so that ``import tensoropt`` stays cheap.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "capture": ("tensoropt.capture", "capture"),
    "OpGraph": ("tensoropt.capture", "OpGraph"),
    "configurations": ("tensoropt.configspace", "configurations"),
    "Configuration": ("tensoropt.configspace.configuration", "Configuration"),
    "Mesh": ("tensoropt.configspace.configuration", "Mesh"),
    "cost_graph": ("tensoropt.cost_graph", "cost_graph"),
    # your own training loop (tensoropt/parallel)
    "parallelize": ("tensoropt.parallel", "parallelize"),
    "ParallelModel": ("tensoropt.parallel", "ParallelModel"),
    "init_distributed": ("tensoropt.parallel", "init_distributed"),
    "micro_batches": ("tensoropt.parallel", "micro_batches"),
    "save_model": ("tensoropt.parallel", "save_model"),
}


def __getattr__(name: str):
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'tensoropt' has no attribute {name!r}")


__all__ = sorted(_LAZY)
