"""Peak memory where it is spent: the device's allocator, or the process's resident set.

``measured.peak_bytes`` of a run is what this module reads, per process (the maximum over ranks
is reported), next to the accounting figure ``measured.memory_bytes`` (the storages the plan
owns, :mod:`tensoropt.executor.state.memory`):

* **CUDA**: ``torch.cuda.max_memory_allocated()`` over the training loop (its peak statistic
  reset when the loop starts) minus ``torch.cuda.memory_allocated()`` before the model was built:
  the caching allocator's live tensors, not its cached free blocks nor the CUDA context.
* **CPU (Linux)**: the resident-set high-water mark ``VmHWM`` of ``/proc/self/status`` over the
  training loop (reset when the loop starts by writing ``5`` to ``/proc/self/clear_refs``) minus
  the resident set ``VmRSS`` before the model was built (read after ``malloc_trim`` returned the
  heap's free memory to the system). What it sees: every page the process touched while
  training: tensors, the allocator's free lists that were not returned, gloo's buffers, Python
  objects, a full model copy made by mistake. The heap is trimmed again when the loop starts, so
  memory that building the model allocated and freed is not counted. What it cannot see: memory
  freed and reused within the loop twice (the high-water mark, not a sum); memory allocated before
  the loop and freed in it is still counted at the loop's start; pages shared with other processes
  (the torch libraries) count fully in each process; and what glibc keeps of memory freed in the
  loop counts as spent (``tensoropt/launch.py`` sets the workers' malloc to return it).
* **elsewhere** (no ``/proc/self/clear_refs``): ``resource.getrusage``'s ``ru_maxrss``, the peak
  of the process's whole life (not reset per loop): an upper bound, reported as such.

Example:
    >>> peak = PeakMemory(torch.device("cpu"))
    >>> peak.start()
    >>> x = torch.ones(4 << 20)  # 16 MiB, touched
    >>> peak.read() >= 16 << 20
    True
"""

from __future__ import annotations

import ctypes
import math
import resource
import sys
from pathlib import Path

import torch

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_bytes(field: str) -> int | None:
    """A ``kB`` field of /proc/self/status in bytes (None where there is no such file)."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _trim_heap() -> None:
    """Return the C heap's free memory to the system (glibc's ``malloc_trim``; no-op elsewhere)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass


def rss_bytes() -> int:
    """The process's resident set now (``VmRSS``; ``ru_maxrss`` where /proc is missing).

    Example:
        >>> rss_bytes() > 0
        True
    """
    now = _status_bytes("VmRSS")
    return now if now is not None else _maxrss_bytes()


def _maxrss_bytes() -> int:
    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, kB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


class PeakMemory:
    """Peak bytes a process spends above its level when this object is made (see the module doc).

    Make it before the model is built; call :meth:`start` when the training loop starts and
    :meth:`read` when it ends.

    Example:
        >>> peak = PeakMemory(torch.device("cpu")); peak.start(); peak.read() >= 0
        True
    """

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if self.cuda:
            self.baseline_bytes = torch.cuda.memory_allocated(self.device)
            self.method = "cuda max_memory_allocated"
        else:
            _trim_heap()
            self.baseline_bytes = rss_bytes()
            self.method = "VmHWM - VmRSS" if self._can_reset() else "ru_maxrss (whole process)"

    @staticmethod
    def _can_reset() -> bool:
        try:
            with _CLEAR_REFS.open("w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    def start(self) -> None:
        """Reset the peak statistic (the training loop starts).

        On the CPU the heap's free memory is first returned to the system (``malloc_trim``), as
        before the baseline: what building and exporting the model allocated and freed is not the
        training loop's.
        """
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            _trim_heap()
            self._can_reset()

    def read(self) -> int:
        """Peak bytes since :meth:`start`, above the level before the model was built (>= 0)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            hwm = _status_bytes("VmHWM")
            peak = hwm if hwm is not None else _maxrss_bytes()
        return max(0, peak - self.baseline_bytes)


def load_model_code(spec, device: torch.device) -> None:
    """Import every module ``spec``'s model is built and exported with, before the baseline is read.

    The model is built on the meta device and exported on meta inputs (no tensor memory; the
    exported program is the one the trainer then uses, cached by
    :mod:`tensoropt.executor.state.local_state`), so the code its factory and ``torch.export`` import on
    first use (``transformers``: about 70 MiB of Python modules, ``torch._dynamo`` and
    ``torch.export`` about 27 MiB, measured) is loaded before :class:`PeakMemory` reads the
    process's level: library code, the same for every plan and device count, not the model's
    memory. The model's tensors are all counted after it (a full copy built by mistake shows).

    Example:
        >>> from tensoropt.executor.job.spec import TrainSpec
        >>> from tensoropt.executor.job.data import InputSpec
        >>> load_model_code(TrainSpec("torch.nn:Linear", (InputSpec((2,)),), 4,
        ...                           {"in_features": 2, "out_features": 1}), torch.device("cpu"))
    """
    from tensoropt.executor.job.materialize import build_skeleton
    from tensoropt.executor.state.local_state import _exported

    _exported(spec, build_skeleton(spec), device)


def predicted_peak_bytes(trainer, runtime: bool = True) -> int | None:
    """The memory model's peak for this process of ``trainer``'s run (None without a predicted memory).

    The plan's predicted ``memory_bytes``, plus the forward/backward turn's transient (twice the largest
    local operator output, :func:`largest_activation_bytes`, or the loss's logits and their gradients,
    :func:`loss_turn_bytes`; with several micro-batches the accumulated gradients are alive there, and
    a micro-batch's fresh gradients beside them at its backward's end) or the optimizer step's temporaries
    beyond the saved activations (the largest and the total local tensor the optimizer steps on
    this rank) or the plan's largest recompute transient (``recompute_transient_bytes`` of
    :class:`tensoropt.executor.job.plan.ExecPlan`, from plan.json's rows), whichever is larger, and the
    device profile's ``runtime_overhead_bytes`` and ``bytes_per_program_node`` times the replayed
    program's node count as traced (:func:`traced_nodes`; the job's cluster; 0 without a job):
    :func:`estimators.peak.predicted_peak_bytes`. The parameter, gradient and optimizer-state bytes
    are this rank's local storages, which the plan's shard shapes fix. ``runtime=False``: without the
    runtime's own memory (no ``runtime_overhead_bytes``, no program bytes), the figure to compare
    with ``measured.peak_tensor_bytes`` (:mod:`tensoropt.executor.state.tensor_peak`).

    Example:
        >>> predicted_peak_bytes(trainer)  # needs a Trainer on a process group  # doctest: +SKIP
        612368384
    """
    from estimators.peak import predicted_peak_bytes as formula
    from estimators.peak import program_bytes
    from tensoropt.executor.state.memory import local

    memory_bytes = trainer.plan.predicted.get("memory_bytes")
    if memory_bytes is None:
        return None
    stepped = [local(p) for group in trainer.optimizer.param_groups for p in group["params"]]
    sizes = [t.numel() * t.element_size() for t in stepped] or [0]
    overhead = per_node = 0
    job = trainer.spec.job or {}
    if job.get("cluster") and runtime:
        from estimators.profiles import load_cluster

        device = load_cluster(job["cluster"]).device
        overhead, per_node = device.runtime_overhead_bytes, device.bytes_per_program_node
    kind = "gpu" if trainer.device.type == "cuda" else "cpu"
    loss_forward, loss_backward = loss_turn_bytes(trainer.ep.graph, trainer.plan)
    return formula(memory_bytes, trainer.state_bytes(), trainer.spec.optimizer, max(sizes), sum(sizes),
                   overhead, kind, largest_activation_bytes(trainer.ep.graph, trainer.plan),
                   program_bytes(traced_nodes(trainer), per_node),
                   recompute_transient_bytes(trainer), grad_bytes=sum(sizes),
                   loss_forward_bytes=loss_forward, loss_backward_bytes=loss_backward,
                   micro_batches=int(getattr(trainer, "micro_batches", 1)),
                   forward_transient_bytes=forward_transient_bytes(trainer.ep.graph, trainer.plan,
                                                                   getattr(trainer, "operands", None) or {}))


def recompute_transient_bytes(trainer) -> int:
    """What the plan's recompute transients add to its memory at their moment in backward, the largest:
    each chain's excess from plan.json's rows (:func:`estimators.peak.recompute_excess_by_chain`) plus,
    for a checkpointed block, the activation gradients in flight through it while its rebuilt
    activations are alive (:func:`tensoropt.executor.state.block_backward.block_gradient_bytes`, from
    the graph: the rows have no such term).

    Example:
        >>> recompute_transient_bytes(trainer)  # needs a Trainer on a process group  # doctest: +SKIP
        18087936
    """
    plan = trainer.plan
    excess = dict(getattr(plan, "recompute_excess", None) or {})
    if not excess:
        return int(plan.predicted.get("recompute_transient_bytes", 0))
    from tensoropt.executor.state.block_backward import block_gradient_bytes

    blocks = ((trainer.spec.job or {}).get("training") or {}).get("checkpoint_modules") or None
    in_flight = block_gradient_bytes(trainer.ep.graph, plan, trainer.sig, blocks)
    return int(max(value + _block_figure(in_flight, chain) for chain, value in excess.items()))


def _block_figure(per_block: dict[str, int], chain: str) -> int:
    """``per_block``'s figure for the rows' chain ``chain`` (a block's module path as the planner's
    capture named it; the executor's graph may name it without a wrapper's prefix), 0 for another chain."""
    if chain in per_block:
        return per_block[chain]
    return next((v for name, v in per_block.items()
                 if chain.endswith("." + name) or name.endswith("." + chain)), 0)


def traced_nodes(trainer) -> int:
    """Operator nodes of ``trainer``'s largest replayed program as traced (0 for the interpreter).

    Example:
        >>> traced_nodes(trainer)  # needs a Trainer on a process group  # doctest: +SKIP
        596
    """
    program = getattr(trainer, "program", None)
    if program is None or not program.programs:
        return 0
    return max(lowered.traced_nodes for lowered, _ in program.programs.values())


def largest_activation_bytes(graph, plan) -> int:
    """The largest operator output of ``graph`` on one process: its bytes over the mesh axes the plan's
    output layout of that node splits. A node the plan does not place (a view, a no-op cast, a
    ``getitem``) is split as its first tensor argument is (it was counted whole: GPT-2's ``view`` of
    the batch-split logits read 8 MiB for the 4 MiB a rank holds).

    Example:
        >>> # not run here: needs a Trainer on a process group
        >>> largest_activation_bytes(trainer.ep.graph, trainer.plan)  # doctest: +SKIP
        33554432
    """
    local = local_output_bytes(graph, plan)
    return max((local[n.name] for n in graph.nodes if n.op == "call_function"), default=0)


def local_output_bytes(graph, plan) -> dict[str, int]:
    """Node name -> the bytes of its output (a tensor; 0 otherwise) on one process, split as
    :func:`largest_activation_bytes` says.

    Example:
        >>> # not run here: needs a Trainer on a process group
        >>> local_output_bytes(trainer.ep.graph, trainer.plan)["addmm"]  # doctest: +SKIP
        3145728
    """
    mesh = list(plan.mesh.shape)
    out: dict[str, int] = {}
    splits: dict[str, int] = {}
    for node in graph.nodes:
        val = node.meta.get("val")
        config = plan.placements.get(node.name)
        split = 1
        if config is not None:
            for axis, placement in enumerate(config.output):
                if str(placement).startswith("S"):
                    split *= mesh[axis]
        else:  # unplaced: laid out as the tensor it reads
            args = [a for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]
            split = splits.get(args[0].name, 1) if args else 1
        splits[node.name] = split
        out[node.name] = val.numel() * val.element_size() // split if isinstance(val, torch.Tensor) else 0
    return out


_LOSSES = {"cross_entropy_loss"}
"""Losses whose backward holds two tensors of its input's size at once (the gradient of the
log-probabilities and of the logits; the log-probabilities themselves are saved, counted)."""


def _split(layout, mesh: list[int]) -> int:
    """How many pieces a layout (one placement string per mesh axis) cuts a tensor into."""
    out = 1
    for axis, placement in enumerate(layout or ()):
        if str(placement).startswith("S"):
            out *= mesh[axis]
    return out


def _nbytes(node) -> int:
    val = node.meta.get("val")
    return val.numel() * val.element_size() if isinstance(val, torch.Tensor) else 0


def loss_turn_bytes(graph, plan) -> tuple[int, int]:
    """(forward, backward): what the loss adds to the saved activations at the forward/backward turn, on
    one process, from ``graph`` and ``plan``.

    For each cross entropy the plan does not run chunked (a ``chunked_loss`` never holds the logits:
    its chunk is its recompute transient): its logits operand, reached through the unplaced views
    between it and the node that computes it, at that node's output layout.

    * forward: the logits, which nothing saves when every reader of them is a loss (cross entropy
      saves its log-probabilities, new, counted with the activations), plus the copy laid out for
      the loss where its input layout is another (both alive while the loss computes);
    * backward: the gradient of the log-probabilities and of the logits at the loss's input layout,
      alive at once (the log-probabilities are saved, counted); where the loss's layout is another
      than the logits', the logits' gradient laid back beside the first.

    Example:
        >>> # not run here: needs a Trainer's exported graph and plan
        >>> loss_turn_bytes(trainer.ep.graph, trainer.plan)  # doctest: +SKIP
        (4194304, 8388608)
    """
    from tensoropt.executor.job.program import packet_name
    from tensoropt.executor.ops.chunked_loss import is_chunked

    mesh = list(plan.mesh.shape)
    forward = backward = 0
    for node in graph.nodes:
        config = plan.placements.get(node.name)
        if node.op != "call_function" or packet_name(node) not in _LOSSES or config is None \
                or is_chunked(config) or not node.args or not hasattr(node.args[0], "meta"):
            continue
        producer = node.args[0]
        while producer.op == "call_function" and producer.name not in plan.placements and \
                producer.all_input_nodes:
            producer = producer.all_input_nodes[0]
        made = plan.placements.get(producer.name)
        made_layout = tuple(made.output) if made is not None else ()
        loss_layout = tuple(config.inputs[0]) if config.inputs else made_layout
        whole = _nbytes(node.args[0])
        at_producer, at_loss = whole // _split(made_layout, mesh), whole // _split(loss_layout, mesh)
        moved = made_layout != loss_layout
        readers = _readers(producer, plan)
        unsaved = at_producer if readers and all(packet_name(r) in _LOSSES for r in readers) else 0
        forward = max(forward, unsaved + (at_loss if moved else 0))
        backward = max(backward, at_loss + (max(at_loss, at_producer) if moved else at_loss))
    return forward, backward


def _readers(node, plan) -> list:
    """The placed nodes that read ``node``'s value, through unplaced nodes (views) between."""
    out, todo, seen = [], list(node.users), set()
    while todo:
        user = todo.pop()
        if user in seen:
            continue
        seen.add(user)
        if user.op == "call_function" and user.name not in plan.placements:
            todo.extend(user.users)
        else:
            out.append(user)
    return out


def _split(layout, mesh: list[int]) -> int:
    """How many pieces a layout cuts a tensor into (the product of its sharded mesh axes)."""
    split = 1
    for axis, placement in enumerate(layout):
        if str(placement).startswith("S"):
            split *= mesh[axis]
    return split


def forward_transient_bytes(graph, plan, operands: dict) -> int:
    """The largest communication transient of forward on one process: at one operator, the tensors a
    redistribution makes beside the ones the plan keeps (saved activations), both alive at that moment.

    * a partial output reduced to the configuration's layout: the partial tensor and its reduced
      copy (an out-of-place all-reduce), ``2 x`` the local output (a width-256 GPT-2's in-split head:
      2 x 8 MiB of logits at the measured peak);
    * an operand gathered from a shard of its producer (``S(d) -> R``, or ``S(d) -> S(e)``, which gloo,
      without all-to-all, runs as a gather then a chunk): the gathered copy, and where ``d != 0`` also
      the buffer gloo's all-gather fills before the copy is cut out of it (``all_gather_into_tensor``
      then ``cat``: 2 x 8 MiB of a BERT's vocabulary-split logits gathered for its batch-split loss).

    ``operands``: node name -> its OpGraph operands (role, index, shape; the trainer's ``operands``).
    Added by :func:`estimators.peak.predicted_peak_bytes` less the parameter gradients (not alive in
    forward).

    Example:
        >>> # not run here: needs a Trainer on a process group
        >>> forward_transient_bytes(trainer.ep.graph, trainer.plan, trainer.operands)  # doctest: +SKIP
        16777216
    """
    from tensoropt.configspace.configuration import shard_dim
    from tensoropt.executor.job.program import arg_nodes

    mesh = list(plan.mesh.shape)
    roots: dict[str, str] = {}
    best = 0
    for node in graph.nodes:
        config = plan.placements.get(node.name)
        if config is None:  # a view (or an unplaced op): laid out as the tensor it reads
            args = [a for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]
            roots[node.name] = roots.get(args[0].name, args[0].name) if args else node.name
            continue
        roots[node.name] = node.name
        val = node.meta.get("val")
        if node.op != "call_function" or not isinstance(val, torch.Tensor):
            continue
        here = 0
        if config.partial_axes:
            here = 2 * val.numel() * val.element_size() // _split(config.output, mesh)
        for a, o in zip(arg_nodes(node), operands.get(node.name, [])):
            if o.get("role") != "input" or o["index"] >= len(config.inputs):
                continue
            source = plan.placements.get(roots.get(a.name, a.name))
            target = config.inputs[o["index"]]
            if source is None:
                continue
            axes = [axis for axis, (p, t) in enumerate(zip(source.output, target))
                    if shard_dim(p) is not None and shard_dim(t) != shard_dim(p)]
            if not axes:
                continue
            gathered = [shard_dim(source.output[axis]) for axis in axes]
            whole = ["R" if axis in axes else t for axis, t in enumerate(target)]  # S(d) -> S(e): gathered
            dtype = getattr(a.meta.get("val"), "dtype", torch.float32)
            itemsize = torch.empty((), dtype=dtype).element_size()
            nbytes = math.prod(o["shape"]) * itemsize // _split(whole, mesh)
            here = max(here, nbytes * (2 if any(d != 0 for d in gathered) else 1))
        best = max(best, here)
    return best

