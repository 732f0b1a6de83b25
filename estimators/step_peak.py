"""The step-order tensor peak: the most bytes alive at one moment of a training step, from a plan's rows.

:func:`estimators.peak.predicted_peak_bytes` adds to the plan's ``memory_bytes`` (every parameter,
gradient, optimizer state and saved activation at once) the largest of its transients. Those terms are
never all alive together: the saved activations are freed as backward goes, the parameter gradients
appear as it goes, and the data-parallel gradient buckets copy the gradients at its end, when almost
no activation is left. Measured on HF ViT at width 256 (docs/results.md, 2026-11-28 step-order
peak): the data-parallel plan's tensor peak is at the end of backward (the gradients and their
bucket copies), 8.5 % below ``memory_bytes``.

This module walks the step in order over the plan's operator rows (plan.json's ``layers``, forward
order; ``redistributions`` give the activations saved on edges, charged to their consumer) and takes
the largest of these moments, with ``PO`` the parameters and optimizer state (alive throughout),
``saved_i`` what row ``i`` keeps for its backward (its ``activation_bytes`` and its incoming edges'
``memory_bytes``), ``G_i`` its gradients and ``C`` the bucket copies of the gradients launched so far::

    forward, row j:     PO + sum(saved_i, i <= j) + forward_transient_j
    turn (loss):        PO + sum(saved_i) + turn_bytes
    backward, row j:    PO + sum(saved_i, i <= j) + sum(G_i, i >= j) + C_j + backward_transient_j
    end of backward:    PO + sum(G_i) + C (every bucket copy, before the gradients become views of it)
    optimizer step:     PO + sum(G_i) + optimizer_transient_bytes

``C_j``: the rows' ``grad_sync_bytes`` (gradients all-reduced in buckets, the data-parallel ones) in
reverse row order, grouped into buckets as the executor's :class:`~tensoropt.executor.state.gradsync.GradSync`
does (the first of ``first_bucket_bytes``, then ``bucket_bytes``): a bucket's flat copy is alive from
its launch (after the gradient that fills it) to the end of backward.

The transients are the caller's, per row node: in forward a communication transient (a partial
output and its reduced copy, a gathered operand: from the exported graph on the executor,
:func:`tensoropt.executor.state.peak_memory.forward_transients`; a row's ``buffer_bytes`` in the planner),
in backward the activation gradients of the row (the gradient of its output and of its inputs) or a
recompute chain rebuilt there.

Example:
    >>> rows = [{"node": "a", "param_bytes": 10, "grad_bytes": 10, "optimizer_bytes": 20,
    ...          "activation_bytes": 30, "grad_sync_bytes": 10},
    ...         {"node": "b", "param_bytes": 10, "grad_bytes": 10, "optimizer_bytes": 20,
    ...          "activation_bytes": 30, "grad_sync_bytes": 10}]
    >>> step_peak_bytes(rows)  # backward of b: 60 held + 60 saved + b's 10 of gradients; memory_bytes: 140
    130.0
    >>> step_peak_bytes(rows, turn_bytes=15)  # the loss's turn: 60 + 60 + 15
    135.0
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from estimators.collectives import FIRST_GRAD_BUCKET_BYTES, GRAD_BUCKET_BYTES


def _f(row: Mapping, key: str) -> float:
    return float(row.get(key) or 0.0)


def step_peak_moments(layers: Iterable[Mapping], redistributions: Iterable[Mapping] = (), *,
                      forward_transients: Mapping[str, float] | None = None,
                      backward_transients: Mapping[str, float] | None = None,
                      turn_bytes: float = 0.0, optimizer_transient_bytes: float = 0.0,
                      first_bucket_bytes: float = FIRST_GRAD_BUCKET_BYTES,
                      bucket_bytes: float = GRAD_BUCKET_BYTES) -> list[tuple[str, float]]:
    """Every moment of the step the module doc lists, as ``(label, bytes alive)``, in step order.

    Args:
        layers: the plan's operator rows in forward order (``node``, ``param_bytes``, ``grad_bytes``,
            ``optimizer_bytes``, ``activation_bytes``, ``grad_sync_bytes``).
        redistributions: edge rows (``dst``, ``memory_bytes``: activations saved on the edge) whose memory
            the rows do not hold (:func:`estimators.breakdown.plan_breakdown`'s rows; plan.json's
            ``layers`` count their saved operands already: pass none with them).
        forward_transients / backward_transients: node -> bytes alive only at that row's forward /
            backward (absent: 0).
        turn_bytes: what the loss adds at the forward/backward turn beside every saved activation.
        optimizer_transient_bytes: the optimizer step's temporaries
            (:func:`estimators.peak.optimizer_step_transient_bytes`).
        first_bucket_bytes, bucket_bytes: the gradient buckets' sizes.

    Example:
        >>> rows = [{"node": "a", "grad_bytes": 4, "activation_bytes": 8, "grad_sync_bytes": 4},
        ...         {"node": "b", "grad_bytes": 4, "activation_bytes": 2, "grad_sync_bytes": 4}]
        >>> step_peak_moments(rows, first_bucket_bytes=4)  # b's gradient fills the first bucket
        ... # doctest: +NORMALIZE_WHITESPACE
        [('forward a', 8.0), ('forward b', 10.0), ('turn', 10.0), ('backward b', 18.0),
         ('backward a', 20.0), ('end of backward', 16.0), ('optimizer step', 8.0)]
    """
    rows = list(layers)
    forward_transients = forward_transients or {}
    backward_transients = backward_transients or {}
    position = {str(r.get("node")): i for i, r in enumerate(rows)}
    saved = [_f(r, "activation_bytes") for r in rows]
    for e in redistributions:
        i = position.get(str(e.get("dst")))
        if i is not None:
            saved[i] += _f(e, "memory_bytes")
    held = sum(_f(r, "param_bytes") + _f(r, "optimizer_bytes") for r in rows)
    grads = [_f(r, "grad_bytes") for r in rows]
    moments: list[tuple[str, float]] = []
    alive = held
    for i, r in enumerate(rows):
        alive += saved[i]
        here = float(forward_transients.get(str(r.get("node")), 0))
        moments.append((f"forward {r.get('node')}", alive + here))
    moments.append(("turn", alive + float(turn_bytes)))
    made = copies = open_bucket = 0.0
    launched = 0
    for i in range(len(rows) - 1, -1, -1):
        node = str(rows[i].get("node"))
        made += grads[i]
        open_bucket += _f(rows[i], "grad_sync_bytes")
        threshold = bucket_bytes if launched else min(bucket_bytes, first_bucket_bytes)
        if open_bucket and open_bucket >= threshold:
            copies, open_bucket, launched = copies + open_bucket, 0.0, launched + 1
        moments.append((f"backward {node}",
                        alive + made + copies + float(backward_transients.get(node, 0))))
        alive -= saved[i]
    copies += open_bucket  # the buckets still open are launched when backward ends
    moments.append(("end of backward", held + made + copies))
    moments.append(("optimizer step", held + made + float(optimizer_transient_bytes)))
    return moments


def backward_excess_bytes(layers: Iterable[Mapping], backward_transients: Mapping[str, float]) -> float:
    """The most one backward adds above the activations it starts with: the largest
    ``backward`` moment of :func:`step_peak_moments` less every row's saved bytes, that is at row ``j``
    ``backward_transient_j + sum(G_i, i >= j) - sum(saved_i, i > j)`` (the activation gradients of
    ``j``, the parameter gradients made so far, less the saved tensors already freed: those of the
    rows after ``j``). Rows hold ``node``, ``activation_bytes`` and ``grad_bytes`` only (the state alive
    throughout is the caller's). What a pipeline stage's backward adds to what it holds
    (:mod:`tensoropt.pipeline.stage_walk`).

    Example:
        >>> rows = [{"node": "fc1", "activation_bytes": 1, "grad_bytes": 1},
        ...         {"node": "gelu", "activation_bytes": 4},
        ...         {"node": "fc2", "activation_bytes": 4, "grad_bytes": 1}]
        >>> # at gelu: its output's and input's gradients (8) + fc2's gradient (1) - fc2's saved (4)
        >>> backward_excess_bytes(rows, {"fc1": 5, "gelu": 8, "fc2": 4})
        5.0
    """
    rows = list(layers)
    saved = sum(_f(r, "activation_bytes") for r in rows)
    moments = step_peak_moments(rows, backward_transients=backward_transients)
    return max((b for label, b in moments if label.startswith("backward ")), default=saved) - saved


def step_peak_bytes(layers: Iterable[Mapping], redistributions: Iterable[Mapping] = (), **terms) -> float:
    """The step's tensor peak on one process: the largest of :func:`step_peak_moments` (keyword
    arguments as there).

    Example:
        >>> step_peak_bytes([{"node": "a", "grad_bytes": 4, "activation_bytes": 8}], turn_bytes=3)
        12.0
    """
    return max((b for _, b in step_peak_moments(layers, redistributions, **terms)), default=0.0)
