"""Plans and frontiers as dataclasses, and their versioned JSON files.

``frontier.json`` (outside tools read it; ``version`` says which form). In memory (``to_json()``,
version 1 files, every reader in tensoropt) each plan entry holds its rows itself::

    {"version": 2, "job": {...the resolved job...},
     "frontiers": [{"devices": 8, "mesh": [2, 2, 2], "mesh_levels": ["gpu", "gpu", "gpu"],
                    "plans": [{"id": "d8-p0", "time_s": 0.123, "memory_bytes": 123456,
                               "micro_batches": 1, "throughput_samples_per_s": 520.3,
                               "tokens_per_s_per_device": 8324.8, "mfu": 0.41,
                               "ops": {"<node>": "<configuration label>", ...},
                               "summary": "conv: batch=8; fc: out=8",
                               "layers": [{"node", "op", "module", "config", "compute_s", "comm_s",
                                           "memory_bytes"}, ...],
                               "redistributions": [{"src", "dst", "from", "to", "time_s",
                                                    "memory_bytes"}, ...]}, ...],
                    "data_parallel": {...a plan entry, id "d8-dp"...},
                    "configurations": {"<node>": {"<label>": Configuration.to_json()}}}, ...],
     "selected": "d8-p3"}

The file (version 2, :func:`frontier_file_text`) keeps each row a frontier's plans share once:
a frontier gains the tables ``layer_rows`` (distinct ``layers`` rows), ``redistribution_rows``
and ``op_rows`` (distinct ``[node, label]`` pairs), and a plan's ``layers``, ``redistributions``
and ``ops`` are lists of indices into them (``ops`` in node order: ``dict(op_rows[i] for i in
ops)``). A reader also accepts the inline forms in a version 2 file (a row object in place of
an index, ``ops`` as a dict); :func:`unpack_frontier_json` resolves the indices and
:func:`load_frontier_file` reads versions 1 and 2 (a version 1 file is the in-memory form).

Plans of a frontier are sorted by time and mutually non-dominated. ``plan.json`` is one plan
entry plus ``devices``, ``mesh`` (``Mesh.to_json()``), ``placements`` (node ->
``Configuration.to_json()``) and ``job``: everything the executor needs to run it without
re-planning (every row inline; plan.json keeps version 1: its form did not change).
:func:`plan_file_text` is the one writer of that text (``tensoropt select`` and
the plot's download button both use it). Files are written atomically (:func:`write_text_atomic`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from estimators.files import write_text_atomic
from estimators.memory_parts import MEMORY_PARTS, TRANSIENT_PARTS
from tensoropt.configspace.configuration import Configuration, Mesh

__all__ = ["PLAN_FILE_INDENT", "PLAN_SCHEMA_VERSION", "READ_VERSIONS", "SCHEMA_VERSION", "Frontier",
           "FrontierFile", "Layer", "Plan", "PlanFile", "PlanFileError", "Redistribution",
           "frontier_file_text", "load_frontier_file", "load_plan_file", "pack_frontier_json",
           "plan_file_json", "plan_file_text", "plan_id", "unpack_frontier_json", "write_selection",
           "write_text_atomic"]

SCHEMA_VERSION = 2
"""Version of frontier.json written by this module (2: rows shared by a frontier's plans stored once)."""
READ_VERSIONS = (1, 2)
"""frontier.json versions :func:`load_frontier_file` reads."""
PLAN_SCHEMA_VERSION = 1
"""Version of plan.json (its form is the same since version 1: one plan, every row inline)."""


class PlanFileError(ValueError):
    """A frontier or plan file is malformed, of an unknown version, or lacks a plan.

    Example:
        >>> str(PlanFileError("out/frontier.json: no plan with id 'd3-p0'"))
        "out/frontier.json: no plan with id 'd3-p0'"
    """


@dataclass
class Layer:
    """One operator of a plan: its configuration and its share of the costs (its memory part
    fields: :data:`estimators.memory_parts.MEMORY_PARTS` and ``TRANSIENT_PARTS``)."""

    node: str
    """OpGraph node name (the torch.export node name)."""
    op: str
    """aten op, e.g. aten.linear.default."""
    module: str
    """Owning module path, e.g. features.0."""
    config: str
    """Configuration label, e.g. batch=4,out=2."""
    compute_s: float
    """Forward + backward compute time of the local shard."""
    comm_s: float
    """Communication inside the operator (partial-sum reduction, gradient sync)."""
    memory_bytes: float
    """Per-device memory the operator holds (parameters, gradients, optimizer state, activations)."""
    param_bytes: float = 0.0
    """Part of ``memory_bytes``: its parameters (and the compute-dtype copies it keeps)."""
    grad_bytes: float = 0.0
    """Part of ``memory_bytes``: its parameters' gradients."""
    optimizer_bytes: float = 0.0
    """Part of ``memory_bytes``: its optimizer state."""
    activation_bytes: float = 0.0
    """Part of ``memory_bytes``: what it saves for backward (its operands in its layout included)."""
    recompute_bytes: float = 0.0
    """Transient, not in ``memory_bytes``: what a recomputing configuration rebuilds in backward."""
    recompute_chain_bytes: float = 0.0
    """Transient: what its chain of recomputing operators rebuilds, alive at once in backward."""
    buffer_bytes: float = 0.0
    """Transient, not in ``memory_bytes``: its largest communication buffer."""

    def to_json(self) -> dict:
        """JSON form (a flat dict; memory parts that are 0 are left out).

        Example:
            >>> layer = Layer("fc", "aten.linear.default", "fc", "replicate", 0.5, 0.0, 8, param_bytes=8)
            >>> layer.to_json()["param_bytes"], "grad_bytes" in layer.to_json()
            (8, False)
        """
        return {k: v for k, v in self.__dict__.items() if k not in _LAYER_PARTS or v}

    @staticmethod
    def from_json(data: dict) -> Layer:
        """Inverse of :meth:`to_json` (plan files without the memory parts read them as 0)."""
        return Layer(**{k: data[k] for k in Layer.__dataclass_fields__ if k in data})



def largest_transient_of_rows(rows: Iterable[dict]) -> float:
    """The largest transient of a plan's rows (a row's ``buffer_bytes`` or ``recompute_chain_bytes``,
    0 where absent): what a plan's peak adds once to its memory. Rows as frontier.json writes them.

    Example:
        >>> largest_transient_of_rows([{"buffer_bytes": 3}, {"recompute_chain_bytes": 5}, {}])
        5.0
    """
    return float(max((max(r.get("buffer_bytes", 0.0), r.get("recompute_chain_bytes", 0.0)) for r in rows),
                     default=0.0))

_LAYER_PARTS = frozenset((*MEMORY_PARTS, *TRANSIENT_PARTS))
"""The memory fields of a :class:`Layer` (:mod:`estimators.memory_parts`), left out of its JSON when 0."""


@dataclass
class Redistribution:
    """A tensor moved between the layout its producer makes and the one its consumer needs."""

    src: str
    """Producer node."""
    dst: str
    """Consumer node."""
    from_layout: list[str]
    """Placements the producer's output has (one per mesh axis)."""
    to_layout: list[str]
    """Placements the consumer computes with."""
    time_s: float
    """Forward + backward time of the redistribution."""
    memory_bytes: float = 0.0
    """Per-device memory charged to the edge (e.g. an activation saved in the consumer's layout)."""
    tied_param: str = ""
    """A tied parameter moved from its first user's layout (where it is stored) to another user's
    (:mod:`estimators.tied`), not an activation; "" for an activation."""

    def to_json(self) -> dict:
        """JSON form; the layouts are stored under "from" and "to"."""
        out = {"src": self.src, "dst": self.dst, "from": list(self.from_layout), "to": list(self.to_layout),
               "time_s": self.time_s, "memory_bytes": self.memory_bytes}
        if self.tied_param:
            out["tied_param"] = self.tied_param
        return out

    @staticmethod
    def from_json(data: dict) -> Redistribution:
        """Inverse of :meth:`to_json`."""
        return Redistribution(data["src"], data["dst"], list(data["from"]), list(data["to"]),
                              data["time_s"], data.get("memory_bytes", 0.0), data.get("tied_param", ""))


@dataclass
class Plan:
    """One point of a frontier: total costs, the label chosen per node, and its breakdown.

    Example:
        >>> p = Plan("d2-p0", 0.5, 1024, {"linear": "batch=2"})
        >>> Plan.from_json(p.to_json()) == p
        True
    """

    id: str
    """Unique in the frontier file: d<devices>-p<index in the frontier, fastest first>."""
    time_s: float
    """Predicted step time (seconds)."""
    memory_bytes: float
    """Predicted memory per device (bytes)."""
    ops: dict[str, str]
    """Node -> configuration label."""
    summary: str = ""
    """One line on how the plan splits the model, e.g. "conv: batch=8; fc: out=8"."""
    layers: list[Layer] = field(default_factory=list)
    """Per-operator breakdown."""
    redistributions: list[Redistribution] = field(default_factory=list)
    """Redistributions between operators that cost something."""
    throughput_samples_per_s: float | None = None
    """global_batch_size / time_s."""
    micro_batches: int = 1
    """Micro-batches per step (gradient accumulation; ``training.micro_batches``): the step runs
    the plan's program on ``global_batch_size / micro_batches`` samples that many times, then
    synchronises the gradients it can defer and steps the optimizer once. ``memory_bytes`` holds one
    micro-batch's activations; ``time_s`` is the whole step."""
    tokens_per_s_per_device: float | None = None
    """For token inputs: ``global_batch_size x tokens per sample / time_s / devices``."""
    mfu: float | None = None
    """Predicted model FLOPs utilisation: the step's training FLOPs (3 x the graph's forward FLOPs)
    / ``time_s`` / (devices x the device's peak FLOP/s in the compute dtype)."""

    pipeline: dict | None = None
    """None, or ``{"stages": p, "schedule": "1F1B", "micro_batches": m, "blocks": [[first, last], ...]}``
    (issue 27's contract; ``blocks`` index :attr:`pipeline_detail`'s block names; under
    ``"Interleaved1F1B"`` ``blocks`` lists the ``2p`` virtual stages in chain order, rank ``r``
    holding ``r`` and ``r + p``)."""
    pipeline_detail: dict | None = None
    peak_tensor_bytes: float | None = None
    """Its tensors' peak per device walked in step order
    (:func:`tensoropt.peak_transients.plan_tensor_peak_bytes`, the figure the executor predicts as
    ``predicted.peak_tensor_bytes``); for a pipelined plan its largest rank's peak
    (``pipeline_detail.rank_peak_bytes``: a stage's held memory plus its largest transient, its
    backward walked in order, :mod:`tensoropt.pipeline.stage_memory`); None where the planner did not
    compute it (several micro-batches, a recompute chain, older files)."""
    """For a pipelined plan: ``bubble_fraction``, ``stage_mesh``/``stage_mesh_levels`` (each stage's
    mesh; ``ops`` labels are prefixed ``pp<p>:``), ``block_names`` and ``stages`` (per stage its
    blocks, rank, device range, in-flight micro-batches, time per micro-batch, once-per-step time,
    memory held, and its parts and tensor peak: ``state_bytes``, ``activation_bytes`` per in-flight
    micro-batch, ``buffer_bytes``, ``transient_bytes``, ``peak_bytes``;
    :mod:`tensoropt.pipeline.stage_memory`); ``rank_memory_bytes``, ``rank_peak_bytes``
    (:func:`tensoropt.pipeline.search.rank_peak_bytes`) and ``virtual_stages_per_rank`` (interleaved:
    a rank's memory is the sum of its virtual stages')."""

    @property
    def largest_transient_bytes(self) -> float:
        """The largest transient over its operators (a communication buffer or a recompute chain's
        rebuilt tensors: a checkpointed block's activations during its backward, one chunk of a
        ``chunked_loss``), added once to :attr:`memory_bytes` at the peak; 0 without per-operator rows.

        Example:
            >>> rows = [Layer("a", "aten.linear.default", "h.0", "r", 0, 0, 8, recompute_chain_bytes=5),
            ...         Layer("b", "aten.linear.default", "h.1", "r", 0, 0, 8, buffer_bytes=3)]
            >>> Plan("d1-p0", 1.0, 16, {}, layers=rows).largest_transient_bytes
            5.0
        """
        return largest_transient_of_rows(layer.__dict__ for layer in self.layers)

    @property
    def peak_memory_bytes(self) -> float:
        """Its tensors' peak per device; what a memory budget is checked against (the selector, the
        planner): :attr:`peak_tensor_bytes` (the step-order peak, the executor's prediction too) where
        the planner computed it, else :attr:`memory_bytes` (the additive objective the frontier holds)
        plus :attr:`largest_transient_bytes`. The process adds the runtime's own memory
        (:mod:`estimators.peak`).

        Example:
            >>> row = Layer("a", "aten.linear.default", "h.0", "r", 0, 0, 8, recompute_chain_bytes=5)
            >>> Plan("d1-p0", 1.0, 16, {}, layers=[row]).peak_memory_bytes
            21.0
            >>> Plan("d1-p0", 1.0, 16, {}, layers=[row], peak_tensor_bytes=14.0).peak_memory_bytes
            14.0
        """
        if self.peak_tensor_bytes is not None:
            return float(self.peak_tensor_bytes)
        return float(self.memory_bytes) + self.largest_transient_bytes

    def to_json(self, tables: _RowTables | None = None) -> dict:
        """JSON form (the frontier.json plan entry; ``micro_batches`` and ``pipeline`` always written,
        ``pipeline`` null when not pipelined). With ``tables`` (the file's form), ``ops``, ``layers``
        and ``redistributions`` are indices into the frontier's shared rows, added to them."""
        out: dict[str, Any] = {"id": self.id, "time_s": self.time_s, "memory_bytes": self.memory_bytes,
                               "micro_batches": self.micro_batches}
        if self.throughput_samples_per_s is not None:
            out["throughput_samples_per_s"] = self.throughput_samples_per_s
        if self.tokens_per_s_per_device is not None:
            out["tokens_per_s_per_device"] = self.tokens_per_s_per_device
        if self.mfu is not None:
            out["mfu"] = self.mfu
        if self.peak_tensor_bytes is not None:
            out["peak_tensor_bytes"] = self.peak_tensor_bytes
        out["summary"] = self.summary
        if tables is None:
            out["ops"] = dict(self.ops)
            out["layers"] = [layer.to_json() for layer in self.layers]
            out["redistributions"] = [r.to_json() for r in self.redistributions]
        else:
            out["ops"] = [tables.op(pair) for pair in self.ops.items()]
            out["layers"] = [tables.layer(layer) for layer in self.layers]
            out["redistributions"] = [tables.row("redistribution_rows", r.to_json())
                                      for r in self.redistributions]
        out["pipeline"] = self.pipeline
        if self.pipeline_detail is not None:
            out["pipeline_detail"] = self.pipeline_detail
        return out

    @staticmethod
    def from_json(data: dict, layer_of: Callable[[dict], Layer] = Layer.from_json) -> Plan:
        """Inverse of :meth:`to_json` (``layer_of`` makes each Layer; a frontier shares equal ones)."""
        return Plan(
            id=data["id"], time_s=data["time_s"], memory_bytes=data["memory_bytes"], ops=dict(data["ops"]),
            summary=data.get("summary", ""),
            layers=[layer_of(x) for x in data.get("layers", [])],
            redistributions=[Redistribution.from_json(x) for x in data.get("redistributions", [])],
            throughput_samples_per_s=data.get("throughput_samples_per_s"),
            micro_batches=int(data.get("micro_batches", 1)),
            tokens_per_s_per_device=data.get("tokens_per_s_per_device"), mfu=data.get("mfu"),
            pipeline=data.get("pipeline"), pipeline_detail=data.get("pipeline_detail"),
            peak_tensor_bytes=data.get("peak_tensor_bytes"),
        )


@dataclass
class Frontier:
    """The Pareto frontier of one device count.

    Example:
        >>> f = Frontier(2, Mesh((2,), ("gpu",)), [Plan("d2-p0", 0.5, 1024, {"fc": "out=2"})])
        >>> Frontier.from_json(f.to_json()) == f
        True
    """

    devices: int
    """Number of devices."""
    mesh: Mesh
    """The device mesh the configurations refer to."""
    plans: list[Plan]
    """Non-dominated plans sorted by time (fastest first)."""
    configurations: dict[str, dict[str, dict]] = field(default_factory=dict)
    """Node -> label -> Configuration.to_json() for every label a plan uses."""
    timing_s: dict[str, float] = field(default_factory=dict)
    """Wall time of each planning stage of this device count (cost_graph, solve, breakdown)."""
    epsilon_bound: float | None = None
    """Proven bound: every exact Pareto-optimal plan is within a factor ``1 + epsilon_bound`` in
    time and in memory of a listed plan (0: the exact frontier; None: not recorded)."""
    pipeline_search: dict | None = None
    """When pipelines were searched (issue 27): the (stages, schedule, micro_batches) tried, stage
    solves, the best plans without a pipeline (``unpipelined_fastest_s``, ``unpipelined_leanest_bytes``)
    and the stage covers' bound (``stage_bound``)."""
    data_parallel: Plan | None = None
    """The data-parallel plan of this device count (id ``d<P>-dp``), priced on the same tables, whether
    or not the frontier lists it (it is dominated when a plan is both faster and leaner): the simplest
    plan, which selection prefers within the estimator's measured error (:mod:`tensoropt.selector`).
    Its labels are in :attr:`configurations`; plan.json can be written for it like for any plan."""

    def to_json(self, shared: bool = False) -> dict:
        """JSON form (an entry of frontier.json's "frontiers"); ``shared``: the file's form
        (version 2: rows its plans share stored once, see :func:`pack_frontier_json`)."""
        out: dict[str, Any] = {"devices": self.devices, "mesh": list(self.mesh.shape),
                               "mesh_levels": list(self.mesh.levels)}
        if self.timing_s:
            out["timing_s"] = dict(self.timing_s)
        if self.epsilon_bound is not None:
            out["epsilon_bound"] = self.epsilon_bound
        if self.pipeline_search is not None:
            out["pipeline_search"] = self.pipeline_search
        if shared:
            tables = _RowTables()
            plans = [p.to_json(tables) for p in self.plans]
            out.update(tables.to_json())
            out["plans"] = plans
        else:
            out["plans"] = [p.to_json() for p in self.plans]
        if self.data_parallel is not None:  # every row inline, in both forms
            out["data_parallel"] = self.data_parallel.to_json()
        out["configurations"] = self.configurations
        return out

    @staticmethod
    def from_json(data: dict) -> Frontier:
        """Inverse of :meth:`to_json` (also reads a frontier of the file's form, rows shared by index)."""
        data = _unpack_frontier(data)
        layers: dict[int, Layer] = {}  # one Layer per shared row (id of its dict)

        def layer_of(row: dict) -> Layer:
            if id(row) not in layers:
                layers[id(row)] = Layer.from_json(row)
            return layers[id(row)]

        return Frontier(
            devices=int(data["devices"]), mesh=_mesh_of(data),
            plans=[Plan.from_json(p, layer_of) for p in data["plans"]],
            configurations=data.get("configurations", {}), timing_s=dict(data.get("timing_s", {})),
            epsilon_bound=data.get("epsilon_bound"), pipeline_search=data.get("pipeline_search"),
            data_parallel=Plan.from_json(data["data_parallel"]) if data.get("data_parallel") else None,
        )

    def all_plans(self) -> list[Plan]:
        """The frontier's plans, then the data-parallel plan when it is recorded apart (every plan
        id a selection may name).

        Example:
            >>> f = Frontier(2, Mesh((2,), ("gpu",)), [Plan("d2-p0", 0.5, 1024, {})],
            ...              data_parallel=Plan("d2-dp", 0.6, 2048, {}))
            >>> [p.id for p in f.all_plans()]
            ['d2-p0', 'd2-dp']
        """
        return self.plans + ([self.data_parallel] if self.data_parallel is not None else [])

    def configuration(self, node: str, label: str) -> Configuration:
        """The Configuration a label of a node stands for."""
        return Configuration.from_json(self.configurations[node][label])


@dataclass
class FrontierFile:
    """The whole frontier.json: the job and one frontier per device count.

    Example:
        >>> ff = FrontierFile(job={"devices": [2]}, frontiers=[])
        >>> FrontierFile.from_json(ff.to_json()) == ff
        True
    """

    job: dict
    """The resolved job (Job.to_dict() with the model preset's defaults filled in)."""
    frontiers: list[Frontier]
    """One per planned device count, ascending."""
    selected: str | None = None
    """Id of the plan last selected (by `tensoropt plan` or `tensoropt select`)."""
    version: int = SCHEMA_VERSION
    """Schema version."""
    timing_s: dict[str, float] = field(default_factory=dict)
    """Wall time of the stages shared by all device counts (capture) and of the whole planning."""
    graph: dict | None = None
    """The fingerprint of the captured graph and the job fields shaping it
    (:func:`tensoropt.capture.fingerprint.fingerprint`); every plan.json carries it too."""
    selection: dict | None = None
    """How ``selected`` was chosen (:meth:`tensoropt.selector.Selection.to_json`: the rule, the margin
    and its source, the rule's plan and the predicted gain); None for a selection by hand."""

    def to_json(self, shared: bool = False) -> dict:
        """JSON form: every row in its plan entry; ``shared``: the file's form (the content of
        frontier.json, equal to ``pack_frontier_json(self.to_json())`` and faster)."""
        out = {"version": self.version, "job": self.job,
               "frontiers": [f.to_json(shared) for f in self.frontiers], "selected": self.selected}
        if self.timing_s:
            out["timing_s"] = dict(self.timing_s)
        if self.graph is not None:
            out["graph"] = self.graph
        if self.selection is not None:
            out["selection"] = self.selection
        return out

    @staticmethod
    def from_json(data: dict, source: str = "frontier.json") -> FrontierFile:
        """Inverse of :meth:`to_json`; reads versions 1 and 2 (:data:`READ_VERSIONS`; the object is
        of version 2, written back in version 2's form) and names ``source`` in errors."""
        _check_version(data, source)
        try:
            return FrontierFile(job=data["job"], frontiers=[Frontier.from_json(f) for f in data["frontiers"]],
                                selected=data.get("selected"),
                                timing_s=dict(data.get("timing_s", {})), graph=data.get("graph"),
                                selection=data.get("selection"))
        except (KeyError, TypeError, ValueError) as e:
            raise PlanFileError(f"{source}: malformed frontier file ({type(e).__name__}: {e})") from None

    def frontier(self, devices: int) -> Frontier | None:
        """The frontier of ``devices`` devices, or None when that count was not planned."""
        return next((f for f in self.frontiers if f.devices == devices), None)

    def find(self, plan_id: str) -> tuple[Frontier, Plan]:
        """The frontier and plan with id ``plan_id`` (KeyError when none)."""
        for f in self.frontiers:
            for p in f.all_plans():
                if p.id == plan_id:
                    return f, p
        raise KeyError(plan_id)

    def write(self, path: str | Path) -> None:
        """Write atomically as JSON (:func:`frontier_file_text`)."""
        write_text_atomic(path, frontier_file_text(self.to_json(shared=True)))


def frontier_file_text(frontier_json: dict) -> str:
    """The text of frontier.json: compact JSON of :func:`pack_frontier_json` (version 2: the rows a
    frontier's plans share are stored once), so frontiers of thousands of plans stay small.

    Example:
        >>> frontier_file_text({"version": 1, "job": {}, "frontiers": [], "selected": None})
        '{"version":2,"job":{},"frontiers":[],"selected":null}\\n'
    """
    return json.dumps(pack_frontier_json(frontier_json), separators=(",", ":")) + "\n"


_SHARED_ROWS = (("layers", "layer_rows"), ("redistributions", "redistribution_rows"))
"""Plan entry field -> the frontier's table of its distinct rows in the file (version 2)."""


class _RowTables:
    """The shared rows of one frontier in the file's form, filled while its plans are written."""

    def __init__(self) -> None:
        self.tables: dict[str, list] = {table: [] for _, table in _SHARED_ROWS}
        self.tables["op_rows"] = []
        self.indices: dict[str, dict] = {table: {} for table in self.tables}
        self.layers: dict[tuple, int] = {}

    def row(self, table: str, row: dict) -> int:
        """Index of a JSON row in ``table`` (appended when new)."""
        return _row_index(row, self.tables[table], self.indices[table])

    def layer(self, layer: Layer) -> int:
        """Index of a Layer's row in ``layer_rows`` (its JSON made once per distinct row)."""
        values = tuple(layer.__dict__.values())
        key = (values, tuple(map(type, values)))
        i = self.layers.get(key)
        if i is None:
            i = self.layers[key] = self.row("layer_rows", layer.to_json())
        return i

    def op(self, pair: tuple[str, str]) -> int:
        """Index of a ``(node, label)`` pair in ``op_rows``."""
        index = self.indices["op_rows"]
        i = index.get(pair)
        if i is None:
            i = index[pair] = len(self.tables["op_rows"])
            self.tables["op_rows"].append(list(pair))
        return i

    def to_json(self) -> dict:
        """The tables, as a frontier's keys."""
        return self.tables


def pack_frontier_json(frontier_json: dict) -> dict:
    """The file's form (version 2) of a frontier.json dict: per frontier, each distinct row of the
    plans' ``layers`` and ``redistributions`` and each ``[node, label]`` pair of their ``ops`` is
    stored once, in ``layer_rows``, ``redistribution_rows`` and ``op_rows``; a plan lists indices.

    Accepts either form (a packed frontier is packed again from its resolved rows); every other
    key is kept as it is. :func:`unpack_frontier_json` is its inverse.

    Example:
        >>> row = {"node": "fc", "op": "aten.linear.default", "module": "fc", "config": "out=2",
        ...        "compute_s": 0.5, "comm_s": 0.0, "memory_bytes": 8}
        >>> fj = {"version": 1, "job": {}, "frontiers": [{"devices": 2, "mesh": [2], "plans": [
        ...     {"id": f"d2-p{i}", "time_s": 1.0, "memory_bytes": 8, "ops": {"fc": "out=2"}, "layers": [row]}
        ...     for i in range(2)]}]}
        >>> packed = pack_frontier_json(fj)
        >>> [p["layers"] for p in packed["frontiers"][0]["plans"]], packed["frontiers"][0]["op_rows"]
        ([[0], [0]], [['fc', 'out=2']])
        >>> unpack_frontier_json(packed)["frontiers"] == fj["frontiers"]
        True
    """
    return {**frontier_json, "version": SCHEMA_VERSION,
            "frontiers": [_pack_frontier(f) for f in frontier_json.get("frontiers", [])]}


def unpack_frontier_json(frontier_json: dict) -> dict:
    """The in-memory form of a frontier.json dict of either version: every plan entry holds its
    ``layers`` and ``redistributions`` rows and its ``ops`` dict itself (the row tables dropped).

    Rows are shared between plans, not copied (treat them as read-only). A dict already in
    that form comes back equal. See :func:`pack_frontier_json` for an example.

    Raises:
        PlanFileError: an index that is not in its table.

    Example:
        >>> unpack_frontier_json({"version": 2, "job": {}, "frontiers": [{"devices": 1, "mesh": [],
        ...     "op_rows": [["fc", "replicate"]], "plans": [{"id": "d1-p0", "ops": [0]}]}]})["frontiers"]
        [{'devices': 1, 'mesh': [], 'plans': [{'id': 'd1-p0', 'ops': {'fc': 'replicate'}}]}]
    """
    return {**frontier_json, "frontiers": [_unpack_frontier(f) for f in frontier_json.get("frontiers", [])]}


def _pack_frontier(frontier: dict) -> dict:
    """One frontier in the file's form (see :func:`pack_frontier_json`); the same object when it is."""
    if _is_packed(frontier):
        return frontier
    frontier = _unpack_frontier(frontier)
    tables = _RowTables()
    plans = []
    for plan in frontier.get("plans", []):
        plan = dict(plan)
        for key, table in _SHARED_ROWS:
            if key in plan:
                plan[key] = [tables.row(table, row) for row in plan[key]]
        if isinstance(plan.get("ops"), dict):
            plan["ops"] = [tables.op(pair) for pair in plan["ops"].items()]
        plans.append(plan)
    out = {k: v for k, v in frontier.items() if k not in ("plans", "configurations")}
    out.update(tables.to_json(), plans=plans)
    if "configurations" in frontier:
        out["configurations"] = frontier["configurations"]
    return out


def _is_packed(frontier: dict) -> bool:
    """True if a frontier is in the file's form: its tables present, every plan's rows indices."""
    if any(t not in frontier for t in ("layer_rows", "redistribution_rows", "op_rows")):
        return False
    for plan in frontier.get("plans", []):
        if not isinstance(plan.get("ops", []), list):
            return False
        for key, _ in _SHARED_ROWS:
            if not all(isinstance(x, int) for x in plan.get(key, [])):
                return False
    return True


def _row_index(row: dict, rows: list[dict], index: dict) -> int:
    """The index of ``row`` in ``rows`` (appended when new); equal rows of other number types
    (1 and 1.0) and field orders stay distinct, so the text reads back as written."""
    try:
        key: tuple = (tuple(row.items()), tuple(map(type, row.values())))
        hash(key)
    except TypeError:  # a list value (a redistribution's layouts)
        key = tuple((k, type(v), tuple(v) if isinstance(v, list) else v) for k, v in row.items())
    i = index.get(key)
    if i is None:
        i = index[key] = len(rows)
        rows.append(row)
    return i


def _unpack_frontier(frontier: dict) -> dict:
    """One frontier in the in-memory form (see :func:`unpack_frontier_json`); the same object when
    it has no row tables and no plan lists ``ops`` by index."""
    tables = [t for _, t in _SHARED_ROWS] + ["op_rows"]
    plans = frontier.get("plans", [])
    if not any(t in frontier for t in tables) and not any(isinstance(p.get("ops"), list) for p in plans):
        return frontier
    out = {k: v for k, v in frontier.items() if k not in tables}
    out["plans"] = [_unpack_plan(frontier, plan) for plan in plans]
    return out


def _unpack_plan(frontier: dict, plan: dict) -> dict:
    """A plan entry with its rows and ops resolved from the frontier's tables."""
    plan = dict(plan)
    try:
        for key, table in _SHARED_ROWS:
            if key in plan:
                rows = frontier.get(table, [])
                plan[key] = [rows[x] if isinstance(x, int) else x for x in plan[key]]
        if isinstance(plan.get("ops"), list):
            pairs = frontier.get("op_rows", [])
            plan["ops"] = dict(pairs[i] for i in plan["ops"])
    except IndexError:
        raise PlanFileError(f"plan {plan.get('id')!r}: an index past its frontier's row table "
                            f"({', '.join(t for _, t in _SHARED_ROWS)}, op_rows)") from None
    return plan


def load_frontier_file(path: str | Path) -> FrontierFile:
    """Read frontier.json (raising PlanFileError that names the file on any problem).

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "frontier.json")
        >>> FrontierFile(job={}, frontiers=[]).write(p)
        >>> load_frontier_file(p).version
        2
    """
    return FrontierFile.from_json(_read_json(path), str(path))


@dataclass
class PlanFile:
    """plan.json: one plan with everything needed to run it (devices, mesh, placements, job).

    Example:
        >>> text = plan_file_text({"version": 1, "job": {}, "frontiers": [{"devices": 1, "mesh": [],
        ...     "mesh_levels": [], "plans": [{"id": "d1-p0", "time_s": 1.0, "memory_bytes": 8, "ops": {}}],
        ...     "configurations": {}}]}, "d1-p0")
        >>> PlanFile.from_json(json.loads(text)).plan.id
        'd1-p0'
    """

    plan: Plan
    """The plan entry."""
    devices: int
    """Number of devices it runs on."""
    mesh: Mesh
    """Its device mesh."""
    placements: dict[str, Configuration]
    """Node -> the configuration the executor applies."""
    job: dict
    """The resolved job it was planned for."""
    selection: dict | None = None
    """How it was selected (frontier.json's ``selection`` record), when a selector chose it."""

    @staticmethod
    def from_json(data: dict, source: str = "plan.json") -> PlanFile:
        """Parse plan.json's content (raising PlanFileError that names ``source``)."""
        _check_version(data, source, (PLAN_SCHEMA_VERSION,))
        try:
            return PlanFile(plan=Plan.from_json(data), devices=int(data["devices"]),
                            mesh=Mesh.from_json(data["mesh"]),
                            placements={n: Configuration.from_json(c) for n, c in data["placements"].items()},
                            job=data["job"], selection=data.get("selection"))
        except (KeyError, TypeError, ValueError) as e:
            raise PlanFileError(f"{source}: malformed plan file ({type(e).__name__}: {e})") from None


def load_plan_file(path: str | Path) -> PlanFile:
    """Read plan.json (raising PlanFileError that names the file on any problem)."""
    return PlanFile.from_json(_read_json(path), str(path))


def plan_file_text(frontier_json: dict, plan_id: str) -> str:
    """The exact text ``tensoropt select`` writes to plan.json for plan ``plan_id``.

    Args:
        frontier_json: the parsed content of frontier.json (either form: rows inline or shared).
        plan_id: id of one of its plans.

    Returns:
        JSON text (indented, newline-terminated) of :func:`plan_file_json`: the plan entry,
        ``devices``, ``mesh``, ``placements``, ``job`` and (when the frontier has it) ``graph``,
        the fingerprint of the graph the plan was made for.

    Raises:
        PlanFileError: no plan has that id, or a label lacks its configuration.

    Example:
        >>> fj = {"version": 1, "job": {}, "frontiers": [{"devices": 1, "mesh": [], "mesh_levels": [],
        ...       "plans": [{"id": "d1-p0", "time_s": 1.0, "memory_bytes": 8, "ops": {}}]}]}
        >>> json.loads(plan_file_text(fj, "d1-p0"))["devices"]
        1
    """
    return json.dumps(plan_file_json(frontier_json, plan_id), indent=PLAN_FILE_INDENT) + "\n"


PLAN_FILE_INDENT = 1
"""Spaces per level of plan.json's text."""


def plan_file_json(frontier_json: dict, plan_id: str) -> dict:
    """The content of plan.json for plan ``plan_id`` (:func:`plan_file_text` writes it): self-contained,
    every row inline, ``version`` :data:`PLAN_SCHEMA_VERSION`.

    Example:
        >>> fj = {"version": 2, "job": {}, "frontiers": [{"devices": 1, "mesh": [], "op_rows": [["fc", "r"]],
        ...       "configurations": {"fc": {"r": {"label": "r"}}},
        ...       "plans": [{"id": "d1-p0", "time_s": 1.0, "memory_bytes": 8, "ops": [0]}]}]}
        >>> plan_file_json(fj, "d1-p0")["placements"]
        {'fc': {'label': 'r'}}
    """
    for frontier in frontier_json.get("frontiers", []):
        extra = [frontier["data_parallel"]] if frontier.get("data_parallel") else []
        for plan in frontier.get("plans", []) + extra:
            if plan.get("id") != plan_id:
                continue
            plan = _unpack_plan(frontier, plan)  # plan.json is self-contained: every row inline
            configs = frontier.get("configurations", {})
            placements = {}
            for node, label in plan["ops"].items():
                try:
                    placements[node] = configs[node][label]
                except KeyError:
                    raise PlanFileError(f"plan {plan_id}: no configuration {label!r} recorded for node "
                                        f"{node!r} in the frontier's 'configurations'") from None
            out = {"version": PLAN_SCHEMA_VERSION, **plan,
                   "pipeline": plan.get("pipeline"), "devices": frontier["devices"],
                   "mesh": _mesh_of(frontier).to_json(),
                   "placements": placements, "job": frontier_json.get("job", {})}
            if frontier_json.get("graph") is not None:  # the plan stays bound to its graph
                out["graph"] = frontier_json["graph"]
            record = frontier_json.get("selection")
            if isinstance(record, dict) and record.get("plan") == plan_id:  # how it was selected
                out["selection"] = record
            return out
    ids = [p.get("id") for f in frontier_json.get("frontiers", []) for p in f.get("plans", [])]
    shown = ", ".join(ids[:8]) + (", ..." if len(ids) > 8 else "")
    raise PlanFileError(f"no plan with id {plan_id!r} in the frontier file (ids: {shown or 'none'})")


def write_selection(frontier_file: FrontierFile, plan_id: str, frontier_file_path: str | Path,
                    plan_path: str | Path, selection: dict | None = None) -> str:
    """Select ``plan_id``: write plan.json and record ``selected`` in frontier.json (each atomically).

    The one writer of a selection (``tensoropt select`` and the UI server's ``POST /api/select``).
    ``selection``: how a selector chose it (:meth:`tensoropt.selector.Selection.to_json`), recorded
    as ``selection`` in both files; None (a choice by hand) clears an earlier record. Returns
    plan.json's text.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> ff = FrontierFile.from_json({"version": 1, "job": {}, "selected": None, "frontiers": [
        ...     {"devices": 1, "mesh": [], "mesh_levels": [], "configurations": {},
        ...      "plans": [{"id": "d1-p0", "time_s": 1.0, "memory_bytes": 8, "ops": {}}]}]})
        >>> _ = write_selection(ff, "d1-p0", d / "frontier.json", d / "plan.json")
        >>> load_frontier_file(d / "frontier.json").selected, load_plan_file(d / "plan.json").plan.id
        ('d1-p0', 'd1-p0')
    """
    frontier_file.selected = plan_id
    frontier_file.selection = selection if selection and selection.get("plan") == plan_id else None
    data = frontier_file.to_json(shared=True)
    text = plan_file_text(data, plan_id)
    write_text_atomic(plan_path, text)
    write_text_atomic(frontier_file_path, frontier_file_text(data))
    return text


def plan_id(devices: int, index: int) -> str:
    """Id of the ``index``-th fastest plan on ``devices`` devices.

    Example:
        >>> plan_id(8, 3)
        'd8-p3'
    """
    return f"d{devices}-p{index}"


def _mesh_of(frontier: dict) -> Mesh:
    shape = tuple(int(s) for s in frontier["mesh"])
    levels = tuple(frontier.get("mesh_levels", ["gpu"] * len(shape)))
    return Mesh(shape=shape, levels=levels)


def _check_version(data: Any, source: str, versions: tuple[int, ...] = READ_VERSIONS) -> None:
    if not isinstance(data, dict) or "version" not in data:
        raise PlanFileError(f"{source}: not a tensoropt file (no 'version' key)")
    if data["version"] not in versions:
        readable = " and ".join(str(v) for v in versions)
        raise PlanFileError(f"{source}: schema version {data['version']!r}; this tensoropt reads version "
                            f"{readable} (re-run `tensoropt plan` with this tensoropt, or read the file "
                            f"with the tensoropt that wrote it)")


def _read_json(path: str | Path) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        raise PlanFileError(f"{path}: cannot read: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise PlanFileError(f"{path}: invalid JSON ({e})") from None
