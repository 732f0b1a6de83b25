"""What one pipeline stage holds on a device, and its peak: the stage memory model.

A stage ``s`` of ``p``, running ``m`` micro-batches of which it keeps ``k_s`` in flight
(:mod:`tensoropt.pipeline.schedules`), holds on each of its devices (measured against
``peak_tensor_bytes`` of the pipelined runtime, ``benchmarks/pipeline_memory.py``)::

    held_s = W_s                                  parameters, gradients, optimizer state
           + k_s * A_s                            the in-flight micro-batches' activations
           + m * (b_in + b_out)                   torch's receive buffers
    peak_s = held_s + transient_s

* ``A_s``: one micro-batch's saved activations as the cost graph prices them (its operators' and
  their inputs' saved tensors), plus ``b_out``, the output the stage sends: ``PipelineStage`` keeps
  it (``fwd_cache``) until that micro-batch's backward; less the received tensor where operators
  save it (the saved input is the receive buffer itself, not a copy).
* ``b_in`` / ``b_out``: the local bytes of the tensor the stage receives / sends. ``PipelineStage``
  allocates one receive buffer per micro-batch for the activations it receives (``s > 0``) and one
  per micro-batch for the gradients it receives back (``s < p - 1``) on the first step and keeps
  them: they scale with ``m``, not with ``k_s``.
* ``transient_s``: the largest of what is alive for a moment beside the held tensors:

  - the backward of one micro-batch (at the first backward, all ``k_s`` in flight), walked over
    the stage's operators in backward order (:mod:`tensoropt.pipeline.stage_walk`): at each
    operator the gradients of its output and of its activation operands (a cross entropy's: twice
    its logits), plus the parameter gradients made so far (the replayed backward returns them at its
    end, :mod:`tensoropt.pipeline_runtime.replay`), less that micro-batch's saved tensors already
    freed; where not walked (the frontier search's sums, which read only the held bytes), bounded by
    twice the stage's largest local operator output. In a steady state (``m > k_s``, 1F1B: a
    backward that follows a later forward, ``k_s`` in flight) torch's ``Schedule1F1B`` still holds
    sent tensors of finished micro-batches beside it: the gradient the previous backward sent back
    (``b_in``: its send ops are kept until the next backward's are made), and the output of the
    warm-up's second-to-last forward (``b_out``: its send work is kept to the cool-down; finished
    by a backward with ``k_s`` in flight where ``k_s >= 2`` and ``m >= 2 k_s - 1``), measured in
    the live sets (docs/results.md);
  - the micro-batch's fresh parameter gradients once its activations are freed, before they are
    added into ``.grad``: ``G_s - A_s`` above the held;
  - the gradient synchronisation over ``dp > 1`` replicas (one flat copy of the gradients) and
    the optimizer step (twice the largest operator's parameters, AdamW's temporaries), both after
    every activation is freed: ``G_s - k_s A_s`` and ``2 P_max - k_s A_s``.

Example:
    >>> mem = StageMemory(state_bytes=100, activation_bytes=30, in_flight=2, buffer_bytes=8,
    ...                   transient_bytes=12)
    >>> mem.held_bytes, mem.peak_bytes
    (168, 180)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StageMemory:
    """One stage's memory per device by part (see the module docstring).

    Example:
        >>> StageMemory(10, 5, 3, 0, 0).held_bytes
        25
    """

    state_bytes: float
    """``W_s``: parameters, gradients, optimizer state."""
    activation_bytes: float
    """``A_s``: one in-flight micro-batch's (its saved activations and the output kept to send)."""
    in_flight: int
    """``k_s``."""
    buffer_bytes: float
    """``m * (b_in + b_out)``: the receive buffers torch keeps."""
    transient_bytes: float
    """The largest transient beyond the held (see the module docstring)."""

    @property
    def held_bytes(self) -> float:
        """``W_s + k_s A_s + m (b_in + b_out)``: the stage's memory in the frontier."""
        return self.state_bytes + self.in_flight * self.activation_bytes + self.buffer_bytes

    @property
    def peak_bytes(self) -> float:
        """``held_bytes + transient_bytes``: the stage's tensor peak."""
        return self.held_bytes + self.transient_bytes

    def to_json(self) -> dict:
        """The parts as a plan's ``pipeline_detail.stages[s]`` carries them.

        Example:
            >>> StageMemory(10, 5, 3, 2, 1).to_json()["peak_bytes"]
            28.0
        """
        return {"state_bytes": float(self.state_bytes), "activation_bytes": float(self.activation_bytes),
                "buffer_bytes": float(self.buffer_bytes), "transient_bytes": float(self.transient_bytes),
                "peak_bytes": float(self.peak_bytes)}


def stage_memory(
    state_bytes: float,
    saved_bytes: float,
    in_flight: int,
    micro_batches: int,
    received_bytes: float = 0.0,
    received_saved_bytes: float = 0.0,
    sent_bytes: float = 0.0,
    largest_output_bytes: float = 0.0,
    grad_bytes: float = 0.0,
    largest_param_bytes: float = 0.0,
    data_parallel: int = 1,
    backward_bytes: float | None = None,
) -> StageMemory:
    """A stage's :class:`StageMemory` from what its cost graph prices (see the module docstring).

    Args:
        state_bytes: ``W_s``, the stage's parameters, gradients and optimizer state per device.
        saved_bytes: one micro-batch's saved activations as the cost graph prices them (operators'
            and edges' memory beyond the state), the received tensor's saved edges included.
        in_flight: ``k_s``.
        micro_batches: ``m``.
        received_bytes: ``b_in``, the received tensor's local bytes (0 on the first stage).
        received_saved_bytes: of ``saved_bytes``, what the edges leaving the received tensor save
            (the receive buffer itself: not counted again, up to ``b_in``).
        sent_bytes: ``b_out``, the sent tensor's local bytes (0 on the last stage).
        largest_output_bytes: the stage's largest local operator output.
        grad_bytes: the stage's parameter gradients per device (one micro-batch's fresh ones).
        largest_param_bytes: the largest operator's local parameters (the optimizer's temporaries).
        data_parallel: replicas of the stage (a flat gradient copy is synchronised when > 1).
        backward_bytes: what one micro-batch's backward adds to the held, walked in backward order
            (:mod:`tensoropt.pipeline.stage_walk`); None: bounded by ``2 x largest_output_bytes``.

    Example:
        >>> mem = stage_memory(100, 20, in_flight=2, micro_batches=4, received_bytes=4,
        ...                    received_saved_bytes=4, sent_bytes=4, largest_output_bytes=6)
        >>> mem.activation_bytes, mem.buffer_bytes, mem.transient_bytes  # 2 x 6 + the 2 kept sends
        (20, 32, 20)
        >>> stage_memory(100, 20, 2, 4, largest_output_bytes=6, backward_bytes=5).transient_bytes
        5.0
    """
    k = int(in_flight)
    activation = saved_bytes - min(received_saved_bytes, received_bytes) + sent_bytes
    in_flight_bytes = k * activation
    backward = 2 * largest_output_bytes if backward_bytes is None else backward_bytes
    if micro_batches > k:  # a steady state: the sends torch's schedule still holds (module docstring)
        backward += received_bytes + (sent_bytes if k >= 2 and micro_batches >= 2 * k - 1 else 0.0)
    transients = [
        backward,
        grad_bytes - activation,
        2 * largest_param_bytes - in_flight_bytes,
        (grad_bytes - in_flight_bytes) if data_parallel > 1 else 0.0,
        0.0,
    ]
    return StageMemory(state_bytes, activation, k, micro_batches * (received_bytes + sent_bytes),
                       max(transients))
