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
import resource
import sys
from pathlib import Path

import torch

from tensoropt.peak_transients import (  # noqa: F401 - the executor's names for the graph's transients
    backward_transients,
    forward_transients,
    local_output_bytes,
    loss_turn_bytes,
    plan_tensor_peak_bytes,
)

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
    if trainer.plan.layers and int(getattr(trainer, "micro_batches", 1)) <= 1:  # the step's moments in order
        operands = getattr(trainer, "operands", None) or {}
        graph, optimizer = trainer.ep.graph, trainer.spec.optimizer
        tensors = plan_tensor_peak_bytes(graph, trainer.plan, operands, optimizer, kind)
        if tensors is not None:
            return tensors + overhead + program_bytes(traced_nodes(trainer), per_node)
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
    the graph: the rows have no such term), less the parameters' compute-dtype copies the later blocks'
    checkpoints kept and released once their backward ran
    (:func:`tensoropt.executor.state.block_backward.released_copy_bytes`: the rows count them in
    ``param_bytes``, alive throughout).

    Example:
        >>> recompute_transient_bytes(trainer)  # needs a Trainer on a process group  # doctest: +SKIP
        18087936
    """
    plan = trainer.plan
    excess = dict(getattr(plan, "recompute_excess", None) or {})
    if not excess:
        return int(plan.predicted.get("recompute_transient_bytes", 0))
    from tensoropt.executor.state.block_backward import (
        block_copy_bytes,
        block_gradient_bytes,
        released_copy_bytes,
    )
    from tensoropt.executor.state.block_checkpoint import block_spans

    blocks = ((trainer.spec.job or {}).get("training") or {}).get("checkpoint_modules") or None
    in_flight = block_gradient_bytes(trainer.ep.graph, plan, trainer.sig, blocks)
    spans = block_spans(trainer.ep.graph, plan.placements, set(), blocks)
    excess = chains_by_block(excess, spans.values(), plan.layers)
    released = released_copy_bytes(block_copy_bytes(spans.values(), param_copy_bytes(trainer)))
    return int(max(value + _block_figure(in_flight, chain) - _block_figure(released, chain)
                   for chain, value in excess.items()))


def chains_by_block(excess: dict[str, float], spans, rows) -> dict[str, float]:
    """The rows' recompute chains (:attr:`~tensoropt.executor.job.plan.ExecPlan.recompute_excess`)
    with each checkpointed block's under its block's name (the span's, as the executor's graph names it).

    plan.json's rows as ``tensoropt select`` writes them (:class:`tensoropt.plans.Layer`) name no
    ``block``, so each row of a block is a chain of its own, keyed by its node, and the ones before
    the block's last row subtract too few gradients: a block's excess is its last row's (in the rows'
    forward order), as :func:`estimators.peak.recompute_excess_by_chain` gives it for rows that name
    their block. Chains keyed by a block already, and chains outside every block, are kept as they are.

    Example:
        >>> from types import SimpleNamespace as S
        >>> spans = [S(name="h.0", nodes=[S(name="a"), S(name="b")])]
        >>> rows = [{"node": "a"}, {"node": "b"}, {"node": "loss"}]
        >>> chains_by_block({"a": 9.0, "b": 5.0, "loss": 1.0}, spans, rows)
        {'h.0': 5.0, 'loss': 1.0}
    """
    block_of = {n.name: span.name for span in spans for n in span.nodes}
    position = {str(r.get("node")): i for i, r in enumerate(rows)}
    out: dict[str, float] = {}
    last: dict[str, int] = {}
    for chain, value in excess.items():
        block = block_of.get(chain)
        if block is None:
            out[chain] = value
        elif position.get(chain, -1) >= last.get(block, -1):
            out[block], last[block] = value, position.get(chain, -1)
    return out


def param_copy_bytes(trainer) -> dict[str, int]:
    """Parameter placeholder name -> bytes of the compute-dtype copy the interpreter casts it to on this
    process (:func:`tensoropt.executor.state.mixed_precision.cast_param`: the local shard, in the mixed
    precision's compute dtype); empty without a mixed precision (nothing is cast).

    Example:
        >>> param_copy_bytes(trainer)  # needs a Trainer on a process group  # doctest: +SKIP
        {'p_model_layers_0_self_attn_q_proj_weight': 65536, ...}
    """
    from tensoropt.executor.state.memory import local

    mixed = getattr(trainer.spec, "mixed", None)
    if mixed is None:
        return {}
    compute = getattr(torch, mixed.compute_dtype)
    out: dict[str, int] = {}
    for name, key in trainer.sig.params.items():
        p = trainer.params.get(key)
        if isinstance(p, torch.Tensor) and p.requires_grad and p.is_floating_point() and p.dtype != compute:
            out[name] = local(p).numel() * compute.itemsize
    return out


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
    return max(forward_transients(graph, plan, operands).values(), default=0)
