"""A hand-made, realistic frontier.json: a VGG-like network planned on 1, 2, 4, 8 and 16 devices.

Shaped like `tensoropt plan` output (tensoropt/plans.py): per device count a mesh, 1-12 mutually
non-dominated plans sorted by time, each with ops, summary, per-layer rows and redistributions,
and the configurations its labels use.
"""

from __future__ import annotations

from tensoropt.configspace.configuration import Configuration, Mesh

GIB = 2**30

# (node, op, module, kind, parameter bytes)
LAYERS = [
    ("conv2d", "aten.conv2d.default", "features.0", "conv", 7_000),
    ("relu", "aten.relu.default", "features.1", "elementwise", 0),
    ("conv2d_1", "aten.conv2d.default", "features.2", "conv", 148_000),
    ("relu_1", "aten.relu.default", "features.3", "elementwise", 0),
    ("max_pool2d", "aten.max_pool2d.default", "features.4", "pool", 0),
    ("conv2d_2", "aten.conv2d.default", "features.5", "conv", 295_000),
    ("relu_2", "aten.relu.default", "features.6", "elementwise", 0),
    ("max_pool2d_1", "aten.max_pool2d.default", "features.7", "pool", 0),
    ("flatten", "aten.flatten.using_ints", "", "view", 0),
    ("linear", "aten.linear.default", "classifier.0", "fc", 411_000_000),
    ("relu_3", "aten.relu.default", "classifier.1", "elementwise", 0),
    ("linear_1", "aten.linear.default", "classifier.3", "fc", 67_000_000),
    ("relu_4", "aten.relu.default", "classifier.4", "elementwise", 0),
    ("linear_2", "aten.linear.default", "classifier.6", "fc", 16_400_000),
]
DEVICE_COUNTS = (1, 2, 4, 8, 16)
PLANS_PER_COUNT = {1: 1, 2: 4, 4: 7, 8: 10, 16: 12}
BUDGET_BYTES = 1 * GIB


def _config(label: str, dim: str | None, mesh: Mesh) -> Configuration:
    axes = tuple(range(len(mesh.shape))) if dim else ()
    shard = ("S(0)",) * len(mesh.shape) if dim == "batch" else ("R",) * len(mesh.shape)
    out = ("S(1)",) * len(mesh.shape) if dim == "out" else shard
    return Configuration(label=label, splits=((dim, axes),) if dim else (), inputs=(shard,), params=(),
                         output=out)


def _plan_layers(devices: int, fc_dim: str, step: float) -> tuple[dict, list[dict], float, float]:
    """Labels, per-layer rows, time and memory of one plan."""
    ops, layers = {}, []
    time_s, memory = 0.0, 0.0
    for k, (node, op, module, kind, param_bytes) in enumerate(LAYERS):
        dim = "batch" if devices > 1 and kind != "fc" else (fc_dim if devices > 1 else None)
        label = f"{dim}={devices}" if dim else "replicate"
        compute = (0.004 + 0.0007 * k) / devices * (1 + 0.05 * step)
        sharded = dim in ("out", "in")
        comm = 0.0 if devices == 1 else (0.0002 * (k + 1) if sharded else 0.00035 * param_bytes / 1e8)
        mem = param_bytes * 4 / (devices if sharded else 1) + 60e6 / devices
        ops[node] = label
        layers.append({"node": node, "op": op, "module": module, "config": label, "compute_s": compute,
                       "comm_s": comm, "memory_bytes": mem})
        time_s += compute + comm
        memory += mem
    return ops, layers, time_s, memory


def make_frontier_json() -> dict:
    """The frontier file content (selected: d8-p1, the fastest 8-device plan under the budget).

    Example:
        >>> len(make_frontier_json()["frontiers"])
        5
    """
    job = {
        "model": {"name": "vgg-mini", "factory": None, "kwargs": {}, "task": "classification",
                  "input_shape": [3, 64, 64], "num_classes": 1000, "seq_len": None, "vocab_size": None},
        "cluster": "h100x8", "devices": list(DEVICE_COUNTS),
        "training": {"global_batch_size": 64, "optimizer": "adamw", "dtype": "float32", "seed": 0,
                     "steps": 100, "learning_rate": 0.001},
        "memory_budget": BUDGET_BYTES, "select": "fastest", "max_time_s": None,
        "planner": {"epsilon": 0.0, "compute": "roofline"},
    }
    frontiers = []
    for devices in DEVICE_COUNTS:
        mesh = Mesh.for_cluster(devices, 8)
        n = PLANS_PER_COUNT[devices]
        plans, configurations = [], {}
        for i in range(n):
            fc_dim = "batch" if i == 0 else ("out" if i % 2 else "in")
            ops, layers, time_s, memory = _plan_layers(devices, fc_dim, i)
            # force a strict time/memory trade-off along the frontier
            time_s *= 1 + 0.09 * i
            memory *= 1 - 0.55 * i / max(n, 2)
            for node, label in ops.items():
                dim = None if label == "replicate" else label.split("=")[0]
                configurations.setdefault(node, {})[label] = _config(label, dim, mesh).to_json()
            plans.append({
                "id": f"d{devices}-p{i}", "time_s": time_s, "memory_bytes": memory, "micro_batches": 1,
                "throughput_samples_per_s": 64 / time_s,
                "summary": "replicate" if devices == 1 else f"conv: batch={devices}; fc: {fc_dim}={devices}",
                "ops": ops, "layers": layers,
                "redistributions": [] if fc_dim == "batch" else [
                    {"src": "flatten", "dst": "linear", "from": ["S(0)"] * len(mesh.shape),
                     "to": ["R"] * len(mesh.shape), "time_s": 0.0011, "memory_bytes": 0.0}],
            })
        frontiers.append({"devices": devices, "mesh": list(mesh.shape), "mesh_levels": list(mesh.levels),
                          "plans": plans, "configurations": configurations})
    return {"version": 1, "job": job, "frontiers": frontiers, "selected": "d8-p1"}
