"""Predicted peak memory per process: the plan's memory plus what the runtime spends around it.

The cost model's ``memory_bytes`` (:mod:`estimators.memory`) counts what a plan owns:
parameters, gradients, optimizer state and saved activations. A process's real peak
(``measured.peak_bytes``, :mod:`tensoropt.executor.state.peak_memory`) adds two terms:

    peak_bytes = state_bytes + max(activation_bytes + backward_transient_bytes,
                                   optimizer_step_transient_bytes, fresh_gradient_bytes)
               + runtime_overhead_bytes + program_bytes
             = memory_bytes + max(backward_transient_bytes,
                                  optimizer_step_transient_bytes - activation_bytes,
                                  fresh_gradient_bytes - activation_bytes)
               + runtime_overhead_bytes + program_bytes

where ``state_bytes`` is the parameters, gradients and optimizer state, ``activation_bytes =
memory_bytes - state_bytes`` the saved activations (freed by the time the optimizer steps, so the
step's temporaries and the activations peak at different moments), ``backward_transient_bytes``
the gradients of activations alive at once when backward starts: twice the largest local
activation (cross entropy's backward holds the gradient of the log-probabilities and of the
logits beside the saved log-probabilities; COSTS.md: a peak, the largest one, added once), or the
loss's own turn where larger (below), less
the parameter gradients ``memory_bytes`` counts, which are not alive yet at that moment (the
loop zeroes them to None; they appear as backward frees the saved activations; with several
micro-batches the accumulated ones are alive, and nothing is taken off): measured on
width-256 GPT-2 and BERT data-parallel plans, the tensor peak is ``memory_bytes`` itself (66.0
against 66.15 MiB), where the unreduced term put it 12-29 % above (docs/results.md, fidelity),
:func:`optimizer_step_transient_bytes` the step's temporaries, ``fresh_gradient_bytes`` a
later micro-batch's gradients beside the accumulated ones at its backward's end (0 for one
micro-batch; the last term is :func:`accumulation_bytes`), ``runtime_overhead_bytes`` the
device profile's per-process constant and ``program_bytes`` (:func:`program_bytes`) its
``bytes_per_program_node`` times the replayed program's node count as traced (``tensoropt
calibrate --memory`` measures both).

* The forward/backward turn (:func:`tensoropt.executor.state.peak_memory.loss_turn_bytes`, from the
  graph). When the loss is computed, the logits it reads are alive though nothing saves them (cross
  entropy saves its log-probabilities, new), with the copy the plan lays them out in for the loss;
  its backward then holds the gradient of the log-probabilities and of the logits at once beside every
  saved activation. Both are candidates for the turn's transient beside twice the largest activation.
  (The interpreted step held every redistributed copy and its source until the forward's end: 9 MiB
  more on the zoo GPT, measured; it now frees them with their source, as the replayed program does.)
* Micro-batches (``micro_batches > 1``): the gradients accumulated by the earlier micro-batches are
  alive at a later one's turn, and its fresh gradients beside them at its backward's end
  (:func:`accumulation_bytes`).
* The optimizer step's temporaries. torch.optim's single-tensor AdamW (what a CPU tensor gets: the
  foreach path is the default on CUDA only) computes ``(exp_avg_sq.sqrt() / bias_correction2_sqrt)``
  per parameter: two parameter-sized temporaries alive at once, so the step peaks at twice the
  largest parameter the optimizer steps. Measured on torch 2.13 CPU with the resident set's
  high-water mark: 1.998 x one 64 MiB parameter, 1.333 x the sum of (64, 64, 16) MiB parameters
  (= 2 x 64 / 96), 0.08 x 96 parameters of 1 MiB (small blocks come from the heap's free memory).
  The foreach path (CUDA) makes ``_foreach_sqrt`` of every parameter of a group at once: one
  parameter-sized temporary per parameter, i.e. 1 x the group (not measured here: no GPU).
  SGD with or without momentum steps in place (measured 0.006 x).
* The runtime's own memory, a line in the replayed program's operator nodes as traced
  (:func:`program_bytes`): a per-process constant ``runtime_overhead_bytes`` (the kernels' code
  paged in, the autograd engine, the allocator's slack) plus ``bytes_per_program_node`` per node
  (the trace's and the program's Python objects, the heap they fragment), both of the device
  profile, measured by ``tensoropt calibrate --memory`` on a tiny GPT at two depths (cpu.yaml:
  12.2 MiB + 5.0 KiB per node; 219 and 726 nodes), the model's and ``torch.export``'s code being
  loaded before the baseline (:mod:`tensoropt.executor.state.peak_memory`). Measured per traced node on
  other families, 1 process: an MLP 9.0 KiB, the tiny HF Llama 12.2 KiB; the constant part follows
  the kernels a model runs (code pages: 5.1 MiB for an MLP, 6.8 for HF Llama, 10.3 for the zoo
  GPT), which no constant can; a 2-process run holds more (gloo's buffers, DTensor's caches: the
  zoo gpt's 2-process runtime 34 MiB against 21 at 1 process). Not priced: what glibc keeps of
  freed memory under its default settings (docs/results.md, benchmarks/allocator.py).

Example:
    >>> predicted_peak_bytes(1000, 900, "adamw", largest_param_bytes=100, total_param_bytes=300,
    ...                      runtime_overhead_bytes=50, device_kind="cpu", largest_activation_bytes=10)
    1150
"""

from __future__ import annotations

from estimators.memory import optimizer_factor


def optimizer_step_transient_bytes(optimizer: str, largest_param_bytes: int, total_param_bytes: int,
                                   device_kind: str = "cpu") -> int:
    """Peak bytes of the optimizer step's temporaries on one process (see the module doc).

    Args:
        optimizer: ``sgd``, ``momentum``, ``adam`` or ``adamw``.
        largest_param_bytes: the largest local tensor the optimizer steps (a ZeRO shard where sharded).
        total_param_bytes: the local bytes of every tensor the optimizer steps.
        device_kind: ``cpu`` (single-tensor path) or ``gpu`` (foreach path).

    Example:
        >>> optimizer_step_transient_bytes("adamw", 64, 96), optimizer_step_transient_bytes("sgd", 64, 96)
        (128, 0)
        >>> optimizer_step_transient_bytes("adamw", 64, 96, "gpu")
        96
    """
    if optimizer_factor(optimizer) < 2:  # sgd, momentum: in place
        return 0
    return total_param_bytes if device_kind == "gpu" else 2 * largest_param_bytes


def program_bytes(traced_nodes: int, bytes_per_program_node: int) -> int:
    """Runtime memory of a replayed program: its operator nodes as traced times the per-node constant.

    Args:
        traced_nodes: ``call_function`` nodes of the traced step before any pass removes some
            (:class:`tensoropt.executor.program.lowering.LoweredStep`; 0 for the interpreter, which traces
            nothing).
        bytes_per_program_node: the device profile's constant (``tensoropt calibrate --memory``).

    Example:
        >>> program_bytes(600, 10240) / 2**20
        5.859375
    """
    if traced_nodes < 0 or bytes_per_program_node < 0:
        raise ValueError(f"program_bytes: traced_nodes ({traced_nodes}) and bytes_per_program_node "
                         f"({bytes_per_program_node}) must be >= 0")
    return int(traced_nodes) * int(bytes_per_program_node)


def predicted_peak_bytes(memory_bytes: float, state_bytes: int, optimizer: str, largest_param_bytes: int,
                         total_param_bytes: int, runtime_overhead_bytes: int,
                         device_kind: str = "cpu", largest_activation_bytes: int = 0,
                         program_bytes: int = 0, recompute_transient_bytes: int = 0,
                         grad_bytes: int = 0, loss_forward_bytes: int = 0, loss_backward_bytes: int = 0,
                         micro_batches: int = 1, forward_transient_bytes: int = 0) -> int:
    """Peak bytes of one process: the plan's memory, the optimizer step's excess, the runtime's own.

    Args:
        memory_bytes: the plan's predicted memory per device (state + saved activations).
        state_bytes: its parameters + gradients + optimizer state on this process.
        optimizer, largest_param_bytes, total_param_bytes, device_kind: as
            :func:`optimizer_step_transient_bytes`.
        runtime_overhead_bytes: the device profile's per-process constant.
        largest_activation_bytes: the largest output of an operator on this process (local shape).
        program_bytes: the replayed program's runtime memory (:func:`program_bytes`).
        recompute_transient_bytes: the plan's largest recompute chain (a checkpointed block's
            activations rebuilt during its backward, one chunk of a ``chunked_loss``;
            :func:`estimators.breakdown.recompute_chains`): alive during backward while the saved
            activations still are, so backward's transient is the larger of it and the activation
            gradients.
        grad_bytes: the parameter gradients ``memory_bytes`` counts: not alive yet when backward starts
            (``zero_grad(set_to_none=True)``; they appear as the saved activations are freed), so the
            activation gradients of the start of backward take their place first; only what exceeds
            them adds to the peak (0: the older sum, every gradient alive beside that transient).
        loss_forward_bytes: what is alive at the forward's end beyond the saved activations: the loss's
            unsaved operands (the logits) and the copy the plan lays them out in for the loss
            (:func:`loss_turn_bytes`).
        loss_backward_bytes: what the loss's backward holds at once beside the saved activations (cross
            entropy: the gradient of the log-probabilities and of the logits; :func:`loss_turn_bytes`):
            backward's transient is the larger of it and twice the largest activation.
        micro_batches: the plan's micro-batches per step. Above 1 the gradients accumulated by the
            earlier micro-batches are alive when a later one's forward ends and its backward starts (no
            ``grad_bytes`` taken off), and at its backward's end its fresh gradients sit beside them
            until they are added (both the interpreted and the replayed step hand them over whole):
            one more gradient set, its activations freed by then (:func:`accumulation_bytes`).
        forward_transient_bytes: forward's largest communication transient (a partial output and its
            reduced copy, a gathered operand and gloo's gather buffer;
            :func:`tensoropt.executor.state.peak_memory.forward_transient_bytes`): alive, like the loss's
            turn, when the parameter gradients are not.

    Example:
        >>> predicted_peak_bytes(1000, 700, "sgd", 100, 300, 50, largest_activation_bytes=20)
        1090
        >>> predicted_peak_bytes(1000, 700, "sgd", 100, 300, 50, largest_activation_bytes=20, program_bytes=7)
        1097
        >>> predicted_peak_bytes(1000, 700, "sgd", 100, 300, 50, largest_activation_bytes=20,
        ...                      recompute_transient_bytes=60)
        1110
        >>> predicted_peak_bytes(1000, 700, "sgd", 100, 300, 50, largest_activation_bytes=20, grad_bytes=30)
        1060
        >>> predicted_peak_bytes(1000, 700, "sgd", 100, 300, 50, largest_activation_bytes=20, grad_bytes=30,
        ...                      micro_batches=4)
        1090
        >>> predicted_peak_bytes(1000, 700, "sgd", 100, 300, 50, largest_activation_bytes=20,
        ...                      loss_forward_bytes=45, loss_backward_bytes=30)
        1095
    """
    transient = optimizer_step_transient_bytes(optimizer, largest_param_bytes, total_param_bytes, device_kind)
    activation_bytes = max(0, int(memory_bytes) - int(state_bytes))
    not_yet = int(grad_bytes) if micro_batches <= 1 else 0  # gradients not alive at the forward/backward turn
    turn = max(2 * int(largest_activation_bytes), int(loss_backward_bytes), int(loss_forward_bytes),
               int(forward_transient_bytes)) - not_yet
    backward = max(turn, 0, int(recompute_transient_bytes))
    accumulated = accumulation_bytes(micro_batches, grad_bytes, activation_bytes)
    return (int(memory_bytes) + max(backward, transient - activation_bytes, accumulated)
            + int(runtime_overhead_bytes) + int(program_bytes))


def accumulation_bytes(micro_batches: int, grad_bytes: int, activation_bytes: int) -> int:
    """Above the plan's memory at the end of a later micro-batch's backward: its fresh gradients beside
    the accumulated ones (one gradient set more), its saved activations freed by then; 0 for one
    micro-batch (gradients are then made into ``.grad`` directly: nothing accumulates).

    The executor hands a micro-batch's gradients over whole: the interpreted step sets ``.grad`` to
    None, runs backward, then adds the new gradient into the held one; the replayed program returns
    every gradient, added to ``.grad`` after the call (:mod:`tensoropt.parallel.runtime`). A plan
    whose state outweighs its activations peaks here.

    Example:
        >>> accumulation_bytes(4, grad_bytes=300, activation_bytes=100), accumulation_bytes(1, 300, 100)
        (200, 0)
    """
    if micro_batches <= 1:
        return 0
    return max(0, int(grad_bytes) - int(activation_bytes))


def recompute_excess_bytes(layers: list[dict], redistributions: list[dict] = ()) -> float:
    """What a recompute transient adds to the plan's memory at its moment in backward (plan.json's rows).

    ``memory_bytes`` counts every gradient and every saved activation at once; when backward reaches
    a checkpointed block (or a recompute chain, or a ``chunked_loss`` chunk) and rebuilds its
    activations, the gradients of the operators at or before it in forward order are not made yet
    (the loop sets them to None) and the activations saved for the operators after it are freed
    already (their backward ran). For each chain (the rows of one ``block``, else one row), with
    ``last`` its last row's position in forward order (the rows' order)::

        excess = chain bytes - sum(grad_bytes of rows <= last) - sum(activation_bytes of rows > last)
                 - sum(memory_bytes of saved-activation edges into rows > last)

    and the result is the largest excess (negative where the transient fits in what is not alive yet:
    backward's other transients then set the peak; :func:`predicted_peak_bytes` takes the larger).
    Measured (tests/executor/test_block_peak.py, docs/results.md "Whole-block checkpointing: the
    tensor peak"): an HF Llama's blocks under ``block_selective`` peak at the first block backward
    reaches (every block's kept outputs alive, few gradients yet), under ``block_recompute`` at the
    last (every gradient made, one block input left).

    Args:
        layers: plan.json's ``layers`` rows, in forward order (``recompute_chain_bytes``,
            ``grad_bytes``, ``activation_bytes``, ``block`` where the row's node is in one).
        redistributions: plan.json's ``redistributions`` rows (``dst``, ``memory_bytes``).

    Example:
        >>> rows = [{"node": "a", "grad_bytes": 10, "activation_bytes": 5},
        ...         {"node": "b", "block": "h.0", "recompute_chain_bytes": 40, "grad_bytes": 10},
        ...         {"node": "c", "block": "h.0", "recompute_chain_bytes": 40, "grad_bytes": 10},
        ...         {"node": "d", "grad_bytes": 10, "activation_bytes": 8}]
        >>> recompute_excess_bytes(rows, [{"dst": "d", "memory_bytes": 2}])  # 40 - 30 - 8 - 2
        0.0
    """
    return max(recompute_excess_by_chain(layers, redistributions).values(), default=0.0)


def recompute_excess_by_chain(layers: list[dict], redistributions: list[dict] = ()) -> dict[str, float]:
    """Chain -> what its recompute transient adds to the plan's memory at its moment in backward
    (:func:`recompute_excess_bytes` per chain: a checkpointed block by its ``block`` name, another
    chain by its last row's node), so that a term priced per block elsewhere (the activation gradients
    in flight through it, :mod:`tensoropt.executor.state.block_backward`) adds to its own block's.

    Example:
        >>> rows = [{"node": "a", "grad_bytes": 10, "activation_bytes": 5},
        ...         {"node": "b", "block": "h.0", "recompute_chain_bytes": 40, "grad_bytes": 10},
        ...         {"node": "c", "grad_bytes": 10, "activation_bytes": 8}]
        >>> recompute_excess_by_chain(rows)  # 40 - 20 - 8
        {'h.0': 12.0}
    """
    position = {row.get("node"): i for i, row in enumerate(layers)}
    grads_upto, acts_after = [], []
    total = 0.0
    for row in layers:
        total += float(row.get("grad_bytes") or 0)
        grads_upto.append(total)
    after = 0.0
    for row in reversed(layers):
        acts_after.append(after)
        after += float(row.get("activation_bytes") or 0)
    acts_after.reverse()
    edges_into = [0.0] * (len(layers) + 1)
    for e in redistributions:
        i = position.get(e.get("dst"))
        if i is not None:
            edges_into[i] += float(e.get("memory_bytes") or 0)
    edges_after = [0.0] * (len(layers) + 1)
    for i in range(len(layers) - 1, -1, -1):
        edges_after[i] = edges_after[i + 1] + edges_into[i]
    chains: dict[str, tuple[float, int]] = {}
    for i, row in enumerate(layers):
        chain = float(row.get("recompute_chain_bytes") or 0)
        if chain > 0:
            key = str(row.get("block") or row.get("node"))
            chains[key] = (chain, i)  # the chain's last row wins
    return {key: chain - grads_upto[last] - acts_after[last] - edges_after[last + 1]
            for key, (chain, last) in chains.items()}
