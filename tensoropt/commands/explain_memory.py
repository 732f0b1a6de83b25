"""The per-device memory of a plan, layer by layer (what ``tensoropt explain`` prints under the
operator table).

A *layer* is a model block: the module path up to its first numeric part (``model.layers.3``,
``blocks.0``, ``features.4``); operators outside any numbered block are grouped by their
module (``model.embed_tokens``, ``lm_head``, the loss). Columns, per device:

* parameters (in a mixed precision the float32 masters and the compute-dtype copies kept for
  backward), gradients, optimizer state, saved activations (what backward keeps, each storage
  once: :mod:`estimators.op_costs`): these add up to the plan's memory;
* recompute transient: what the chain of recomputing operators its operators belong to rebuilds
  during backward (alive at once: each rebuilt value is kept until every consumer's backward has
  read it; a chain may span layers; :func:`estimators.breakdown.recompute_chains`); not in the
  plan's memory;
* largest transient: the largest single transient of the layer (a communication buffer, or the
  recompute transient).

The plan's memory plus the largest transient over the layers, added once, is what its tensors
peak at (a process adds the runtime's own memory and the optimizer step's temporaries:
:mod:`estimators.peak`).

Example:
    >>> from tensoropt.plans import Layer, Plan, PlanFile
    >>> from tensoropt.configspace.configuration import Mesh
    >>> rows = [Layer("a", "aten.linear.default", "blocks.0.fc", "replicate", 0, 0, 10, param_bytes=4,
    ...               activation_bytes=6), Layer("b", "aten.linear.default", "head", "replicate", 0, 0, 2,
    ...               param_bytes=2)]
    >>> [(r.layer, r.param_bytes, r.activation_bytes) for r in memory_by_layer(rows)]
    [('blocks.0', 4.0, 6.0), ('head', 2.0, 0.0)]
"""

from __future__ import annotations

from dataclasses import dataclass

from estimators.memory_parts import MEMORY_PARTS
from tensoropt.config import format_size
from tensoropt.plans import Layer, PlanFile
from tensoropt.tables import format_table


def layer_of(module: str) -> str:
    """The block an operator of ``module`` belongs to (see the module docstring).

    Example:
        >>> layer_of("model.model.layers.12.self_attn.q_proj"), layer_of("model.norm"), layer_of("")
        ('model.model.layers.12', 'model.norm', '(model)')
    """
    parts = [p for p in module.split(".") if p]
    for i, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[: i + 1])
    return ".".join(parts) or "(model)"


PART_LABELS = {"param_bytes": "parameters", "grad_bytes": "gradients", "optimizer_bytes": "optimizer",
               "activation_bytes": "activations"}
"""The memory table's column header of each of :data:`estimators.memory_parts.MEMORY_PARTS`."""


@dataclass
class LayerMemory:
    """The memory of one layer of a plan, per device (see the module docstring)."""

    layer: str
    """Module path of the block."""
    operators: int
    """Operators in it."""
    param_bytes: float = 0.0
    """Parameters (and the compute-dtype copies kept for backward)."""
    grad_bytes: float = 0.0
    """Parameter gradients."""
    optimizer_bytes: float = 0.0
    """Optimizer state."""
    activation_bytes: float = 0.0
    """Saved activations."""
    recompute_bytes: float = 0.0
    """Rebuilt during its backward by the recompute chain of its operators (transient)."""
    largest_transient_bytes: float = 0.0
    """Its largest transient: a communication buffer or the recompute transient."""

    @property
    def memory_bytes(self) -> float:
        """Parameters + gradients + optimizer state + saved activations (:data:`MEMORY_PARTS`)."""
        return sum(getattr(self, k) for k in MEMORY_PARTS)


def memory_by_layer(layers: list[Layer]) -> list[LayerMemory]:
    """A plan's operators grouped into layers (:func:`layer_of`), in order of first appearance.

    Example:
        >>> rows = [Layer("a", "aten.relu.default", "blocks.1.act", "batch=2", 0, 0, 8, activation_bytes=8,
        ...               recompute_bytes=8, recompute_chain_bytes=8)]
        >>> m = memory_by_layer(rows)[0]
        >>> m.layer, m.recompute_bytes, m.largest_transient_bytes
        ('blocks.1', 8, 8)
    """
    out: dict[str, LayerMemory] = {}
    for x in layers:
        name = layer_of(x.module)
        m = out.setdefault(name, LayerMemory(name, 0))
        m.operators += 1
        for k in MEMORY_PARTS:
            setattr(m, k, getattr(m, k) + getattr(x, k))
        m.recompute_bytes = max(m.recompute_bytes, x.recompute_chain_bytes)
        m.largest_transient_bytes = max(m.largest_transient_bytes, x.buffer_bytes)
    for m in out.values():
        m.largest_transient_bytes = max(m.largest_transient_bytes, m.recompute_bytes)
    return list(out.values())


def has_memory_parts(layers: list[Layer]) -> bool:
    """Whether the plan file carries the memory parts (plan files written before them do not).

    Example:
        >>> has_memory_parts([Layer("a", "aten.relu.default", "", "replicate", 0, 0, 8)])
        False
    """
    return any(getattr(x, k) for x in layers for k in MEMORY_PARTS)


def memory_table(plan_file: PlanFile) -> str:
    """The per-layer memory table of a plan, its totals and its peak (see the module docstring).

    Example:
        >>> from tensoropt.plans import Plan
        >>> from tensoropt.configspace.configuration import Mesh
        >>> p = Plan("d1-p0", 1.0, 10, {"a": "replicate"}, layers=[Layer("a", "aten.linear.default",
        ...          "blocks.0.fc", "replicate", 0, 0, 10, param_bytes=4, activation_bytes=6)])
        >>> "blocks.0" in memory_table(PlanFile(p, 1, Mesh((), ()), {}, {}))
        True
    """
    layers = plan_file.plan.layers
    if not has_memory_parts(layers):
        return "(this plan file has no memory parts per operator: plan it again to see them)"
    groups = memory_by_layer(layers)
    rows = [[m.layer, m.operators, *(format_size(getattr(m, k)) for k in MEMORY_PARTS),
             *(format_size(v) for v in (m.recompute_bytes, m.largest_transient_bytes, m.memory_bytes))]
            for m in groups]
    total = LayerMemory("total", sum(m.operators for m in groups))
    for m in groups:
        for k in MEMORY_PARTS:
            setattr(total, k, getattr(total, k) + getattr(m, k))
    peak = max(groups, key=lambda m: m.largest_transient_bytes)
    rows.append([total.layer, total.operators, *(format_size(getattr(total, k)) for k in MEMORY_PARTS), "-",
                 format_size(peak.largest_transient_bytes), format_size(total.memory_bytes)])
    headers = ["layer", "ops", *(PART_LABELS[k] for k in MEMORY_PARTS), "recompute transient",
               "largest transient", "memory"]
    table = format_table(headers, rows, right=list(range(1, len(headers))))
    step_order = plan_file.plan.peak_tensor_bytes
    step_line = ("" if step_order is None else
                 f"\nits tensors' peak in step order (what select checks against a budget, the executor's "
                 f"predicted.peak_tensor_bytes): {format_size(step_order)} (tensoropt/peak_transients.py)")
    if step_order is not None and plan_file.plan.pipeline:
        step_line = (f"\nits largest pipeline rank's tensor peak (what select checks against a budget): "
                     f"{format_size(step_order)} (pipeline_detail.rank_peak_bytes, "
                     "tensoropt/pipeline/stage_memory.py)")
    return (f"memory per device by layer:\n{table}\n"
            f"memory {format_size(total.memory_bytes)} + the largest transient "
            f"{format_size(peak.largest_transient_bytes)} ({peak.layer}) = "
            f"{format_size(total.memory_bytes + peak.largest_transient_bytes)} (a process also holds the "
            "runtime's own memory and the optimizer step's temporaries: estimators/peak.py)" + step_line)
