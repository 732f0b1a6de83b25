"""The names of an operator's memory parts: one list behind the cost model's fields, the cost
graph's arrays, a plan's rows (plan.json / frontier.json ``layers``) and ``tensoropt explain``'s
memory table.

An operator's ``memory_bytes`` (the additive objective) adds up from :data:`MEMORY_PARTS`: the
:class:`estimators.op_costs.Cost` of a configuration carries the first three
(:data:`STATE_PARTS`), the saved activations are the rest (``memory_bytes`` minus the state).
:data:`TRANSIENT_PARTS` are alive only for a while (rebuilt in backward, communication buffers):
not in ``memory_bytes``, added once to a plan's peak (:func:`estimators.breakdown.plan_breakdown`).

A new part is added here, declared (with its docstring) on ``Cost`` where the cost model prices it
and on :class:`tensoropt.plans.Layer` and :class:`tensoropt.commands.explain_memory.LayerMemory`
(tests/planner/test_explain_memory.py fails while one lacks it), and labelled in
``explain_memory.PART_LABELS``; the cost graph, the plan rows and the table follow these tuples.

Example:
    >>> MEMORY_PARTS[:len(STATE_PARTS)] == STATE_PARTS, "activation_bytes" in MEMORY_PARTS
    (True, True)
"""

from __future__ import annotations

STATE_PARTS = ("param_bytes", "grad_bytes", "optimizer_bytes")
"""Parts of ``memory_bytes`` a :class:`estimators.op_costs.Cost` carries: parameters (and the
compute-dtype copies kept for backward), their gradients, the optimizer state."""

MEMORY_PARTS = (*STATE_PARTS, "activation_bytes")
"""The parts an operator's ``memory_bytes`` adds up from, in the order plans and ``explain`` list
them; ``activation_bytes`` (what it saves for backward) is ``memory_bytes`` minus the state."""

COST_TRANSIENT_PARTS = ("recompute_bytes",)
"""Transients a :class:`estimators.op_costs.Cost` carries besides ``buffer_bytes``: what a
recomputing configuration rebuilds in backward."""

TRANSIENT_PARTS = (*COST_TRANSIENT_PARTS, "recompute_chain_bytes", "buffer_bytes")
"""Transients of a plan's row: the configuration's own, what its recompute chain rebuilds at once
(:func:`estimators.breakdown.recompute_chains`) and its largest communication buffer."""

COST_PARTS = (*STATE_PARTS, *COST_TRANSIENT_PARTS)
"""The part fields of a :class:`estimators.op_costs.Cost`, kept per configuration on the cost
graph's nodes and read back into a plan's rows."""
