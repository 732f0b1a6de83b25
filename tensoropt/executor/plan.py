"""The part of a plan.json the executor needs: the mesh and one Configuration per node."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from tensoropt.configspace.configuration import Configuration, Mesh


@dataclass(frozen=True)
class ExecPlan:
    """A plan as the executor runs it.

    Attributes:
        plan_id: the plan's id in its frontier (e.g. ``"d2-p0"``).
        mesh: the device mesh the layouts refer to.
        placements: node name -> configuration of that node.
        predicted: the planner's predicted ``time_s`` and ``memory_bytes`` (may be empty).
    """

    plan_id: str
    mesh: Mesh
    placements: dict[str, Configuration]
    predicted: dict[str, float] = field(default_factory=dict)

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
        plan_id = str(data.get("id", data.get("plan_id", "plan")))
        if "devices" in data and int(data["devices"]) != mesh.num_devices:
            raise ValueError(
                f"plan {plan_id}: 'devices' is {data['devices']} but its mesh {list(mesh.shape)} "
                f"has {mesh.num_devices} devices"
            )
        return ExecPlan(plan_id, mesh, placements, predicted)

    @staticmethod
    def load(path: str | Path) -> ExecPlan:
        """Read a plan.json file.

        Example:
            >>> ExecPlan.load("plan.json")  # doctest: +SKIP
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
        }
