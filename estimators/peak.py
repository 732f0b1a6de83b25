"""Predicted peak memory per process: the plan's memory plus what the runtime spends around it.

The cost model's ``memory_bytes`` (:mod:`estimators.memory`) counts what a plan owns:
parameters, gradients, optimizer state and saved activations. A process's real peak
(``measured.peak_bytes``, :mod:`tensoropt.executor.peak_memory`) adds two terms:

    peak_bytes = state_bytes + max(activation_bytes + backward_transient_bytes,
                                   optimizer_step_transient_bytes)
               + runtime_overhead_bytes
             = memory_bytes + max(backward_transient_bytes,
                                  optimizer_step_transient_bytes - activation_bytes)
               + runtime_overhead_bytes

where ``state_bytes`` is the parameters, gradients and optimizer state, ``activation_bytes =
memory_bytes - state_bytes`` the saved activations (freed by the time the optimizer steps, so the
step's temporaries and the activations peak at different moments), ``backward_transient_bytes``
the gradients of activations alive at once when backward starts: twice the largest local
activation (cross entropy's backward holds the gradient of the log-probabilities and of the
logits beside the saved log-probabilities; COSTS.md: a peak, the largest one, added once),
:func:`optimizer_step_transient_bytes` the step's temporaries and ``runtime_overhead_bytes`` the
device profile's per-process constant (``tensoropt calibrate --memory`` measures it).

* The optimizer step's temporaries. torch.optim's single-tensor AdamW (what a CPU tensor gets: the
  foreach path is the default on CUDA only) computes ``(exp_avg_sq.sqrt() / bias_correction2_sqrt)``
  per parameter: two parameter-sized temporaries alive at once, so the step peaks at twice the
  largest parameter the optimizer steps. Measured on torch 2.13 CPU with the resident set's
  high-water mark: 1.998 x one 64 MiB parameter, 1.333 x the sum of (64, 64, 16) MiB parameters
  (= 2 x 64 / 96), 0.08 x 96 parameters of 1 MiB (small blocks come from the heap's free memory).
  The foreach path (CUDA) makes ``_foreach_sqrt`` of every parameter of a group at once: one
  parameter-sized temporary per parameter, i.e. 1 x the group (not measured here: no GPU).
  SGD with or without momentum steps in place (measured 0.006 x).
* The runtime's own memory: the exported program and its Python objects, the autograd engine,
  gloo's buffers, the allocator's slack: a per-process constant ``runtime_overhead_bytes`` of the
  device profile (8.4 MiB measured on the development CPU for a tiny MLP, the model's and
  ``torch.export``'s code being loaded before the baseline, :mod:`tensoropt.executor.peak_memory`).
  Not priced: memory that grows with the program's node count (the traced program's and the
  interpreter's Python objects: 17-24 MiB more on the tiny HF Llama than on the MLP), and what
  glibc keeps of freed memory under its default settings (the figures agree within 0.9-9.4 % on
  big-fc and gpt with ``MALLOC_ARENA_MAX=1 MALLOC_TRIM_THRESHOLD_=0``, 7-43 % below without).

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


def predicted_peak_bytes(memory_bytes: float, state_bytes: int, optimizer: str, largest_param_bytes: int,
                         total_param_bytes: int, runtime_overhead_bytes: int,
                         device_kind: str = "cpu", largest_activation_bytes: int = 0) -> int:
    """Peak bytes of one process: the plan's memory, the optimizer step's excess, the runtime constant.

    Args:
        memory_bytes: the plan's predicted memory per device (state + saved activations).
        state_bytes: its parameters + gradients + optimizer state on this process.
        optimizer, largest_param_bytes, total_param_bytes, device_kind: as
            :func:`optimizer_step_transient_bytes`.
        runtime_overhead_bytes: the device profile's per-process constant.
        largest_activation_bytes: the largest output of an operator on this process (local shape).

    Example:
        >>> predicted_peak_bytes(1000, 700, "sgd", 100, 300, 50, largest_activation_bytes=20)
        1090
    """
    transient = optimizer_step_transient_bytes(optimizer, largest_param_bytes, total_param_bytes, device_kind)
    activation_bytes = max(0, int(memory_bytes) - int(state_bytes))
    backward = 2 * int(largest_activation_bytes)
    return int(memory_bytes) + max(backward, transient - activation_bytes) + int(runtime_overhead_bytes)
