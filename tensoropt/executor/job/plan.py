"""The part of a plan.json the executor needs: the mesh and one Configuration per node."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from estimators.peak import recompute_excess_by_chain
from tensoropt.configspace.configuration import Configuration, Mesh


@dataclass(frozen=True)
class ExecPlan:
    """A plan as the executor runs it.

    Attributes:
        plan_id: the plan's id in its frontier (e.g. ``"d2-p0"``).
        mesh: the device mesh the layouts refer to.
        placements: node name -> configuration of that node.
        predicted: the planner's predicted ``time_s`` and ``memory_bytes`` (may be empty), and
            ``recompute_transient_bytes`` where its operator rows rebuild something in backward (what
            the largest recompute chain, a checkpointed block's activations or one chunk of a loss,
            adds to ``memory_bytes`` at its moment in backward:
            :func:`estimators.peak.recompute_excess_bytes`).
        graph: the fingerprint of the graph the plan was made for (plan.json's ``graph``;
            None for a hand-written plan or one written before fingerprints).
        layers, redistributions: plan.json's operator and edge rows (empty where the file has none):
            the step-order peak walks them (:mod:`estimators.step_peak`).
    """

    plan_id: str
    mesh: Mesh
    placements: dict[str, Configuration]
    predicted: dict[str, float] = field(default_factory=dict)
    graph: dict | None = None
    recompute_excess: dict[str, float] = field(default_factory=dict)
    """Chain (a checkpointed block's name, else its last node) -> what its recompute transient adds
    to ``memory_bytes`` at its moment in backward (:func:`estimators.peak.recompute_excess_by_chain`;
    ``predicted["recompute_transient_bytes"]`` is the largest)."""
    layers: tuple = ()
    redistributions: tuple = ()

    @property
    def devices(self) -> int:
        """Number of devices (processes) the plan needs."""
        return self.mesh.num_devices

    @staticmethod
    def from_json(data: dict) -> ExecPlan:
        """Read a plan.json document (issue 5 schema: id, time_s, memory_bytes, mesh, placements).

        Example:
            >>> p = ExecPlan.from_json({"id": "d1-p0", "mesh": {"shape": [], "levels": []},
            ...                         "placements": {}, "time_s": 0.1, "memory_bytes": 10})
            >>> p.devices, p.predicted["time_s"]
            (1, 0.1)
        """
        for key in ("mesh", "placements"):
            if key not in data:
                raise ValueError(f"plan is missing the key {key!r} "
                                 "(expected a plan.json written by `tensoropt select`)")
        mesh_data = data["mesh"]
        if isinstance(mesh_data, list):  # the frontier form: a bare shape
            mesh_data = {"shape": mesh_data, "levels": ["gpu"] * len(mesh_data)}
        mesh = Mesh.from_json(mesh_data)
        placements = {name: Configuration.from_json(c) for name, c in data["placements"].items()}
        predicted = {k: float(data[k]) for k in ("time_s", "memory_bytes") if data.get(k) is not None}
        rows = [row for row in data.get("layers") or [] if isinstance(row, dict)]
        edges = [e for e in data.get("redistributions") or [] if isinstance(e, dict)]
        excess: dict[str, float] = {}
        if any(float(row.get("recompute_chain_bytes") or 0) for row in rows):  # a recompute transient
            # (a checkpointed block's activations, a loss chunk) beyond what is not alive at its moment
            excess = recompute_excess_by_chain(rows, edges)
            predicted["recompute_transient_bytes"] = max(excess.values(), default=0.0)
        plan_id = str(data.get("id", data.get("plan_id", "plan")))
        if "devices" in data and int(data["devices"]) != mesh.num_devices:
            raise ValueError(
                f"plan {plan_id}: 'devices' is {data['devices']} but its mesh {list(mesh.shape)} "
                f"has {mesh.num_devices} devices"
            )
        return ExecPlan(plan_id, mesh, placements, predicted, data.get("graph"), excess, tuple(rows),
                        tuple(edges))

    @staticmethod
    def load(path: str | Path) -> ExecPlan:
        """Read a plan.json file.

        Example:
            >>> ExecPlan.load("plan.json")  # needs a plan.json from `tensoropt select`  # doctest: +SKIP
        """
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"cannot read plan file {path}: {err}") from err
        try:
            return ExecPlan.from_json(data)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"plan file {path}: {err}") from err

    def to_json(self) -> dict:
        """JSON form readable by :meth:`from_json`."""
        return {
            "id": self.plan_id,
            "devices": self.devices,
            "mesh": self.mesh.to_json(),
            "placements": {k: c.to_json() for k, c in self.placements.items()},
            **self.predicted,
            **({"graph": self.graph} if self.graph is not None else {}),
            **({"layers": list(self.layers), "redistributions": list(self.redistributions)}
               if self.layers else {}),
        }


class PlanGraphMismatch(ValueError):
    """A plan was made for another graph than the model's: the message names the node and the fix."""


def check_plan_graph(plan: ExecPlan, graph, job: dict | None = None, source: str = "the plan",
                     dtypes: bool = True) -> list[str]:
    """Refuse a plan made for another graph; return warnings (None of them is a silent replicate).

    Args:
        plan: the plan to run.
        graph: the OpGraph of the model being run (captured as ``plan`` captures it).
        job: the resolved job being run (its graph-shaping fields are compared too), or None.
        source: how to name the plan in messages (e.g. its file).
        dtypes: compare dtypes too (False: a float64 numerical check of a float32 plan).

    Returns:
        Warnings: job fields that differ although the graph is the same; for a plan without a
        fingerprint (hand-written, or older), the graph nodes it does not place (run replicated).

    Raises:
        PlanGraphMismatch: the graphs differ (first differing node named), or a plan with a
            fingerprint lacks a placement for one of the graph's nodes.

    Example:
        >>> import torch
        >>> from tensoropt.capture import capture
        >>> g = capture(torch.nn.Linear(3, 2), (torch.ones(4, 3),))
        >>> plan = ExecPlan.from_json({"id": "d2-p0", "mesh": {"shape": [2], "levels": ["gpu"]},
        ...                            "placements": {}})
        >>> check_plan_graph(plan, g)[0][:75]
        'the plan (d2-p0) was written without a graph fingerprint and does not place'
    """
    from tensoropt.capture.fingerprint import fingerprint, job_difference, mismatch

    if not plan.mesh.shape and not plan.placements:  # the plain 1-process run: nothing to bind
        return []
    running = fingerprint(graph, job or {})
    problem = mismatch(plan.graph, running, set(plan.placements), dtypes)
    replan = ("re-plan with `tensoropt plan JOB.yaml --out DIR` and run DIR/plan.json "
              "(a plan is made for one graph)")
    if problem:
        raise PlanGraphMismatch(f"{source} ({plan.plan_id}) was made for another graph: {problem}; {replan}")
    missing = [row[0] for row in running["nodes"] if row[0] not in plan.placements]
    if missing and plan.graph is not None:
        raise PlanGraphMismatch(f"{source} ({plan.plan_id}) has no placement for node {missing[0]!r} of its "
                                f"graph ({len(missing)} such nodes); {replan}")
    warnings = []
    if missing:
        names = ", ".join(repr(m) for m in missing[:5]) + (" ..." if len(missing) > 5 else "")
        warnings.append(f"{source} ({plan.plan_id}) was written without a graph fingerprint and does not "
                        f"place node(s) {names}: they run replicated; {replan}")
    differ = job_difference(plan.graph, running) if job is not None and plan.graph is not None else []
    if differ:
        warnings.append(f"{source} ({plan.plan_id}): the job's {', '.join(differ)} differ from the plan's "
                        "job; the graph is the same, so the plan runs")
    return warnings
