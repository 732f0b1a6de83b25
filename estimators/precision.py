"""Training precision: which dtype computes, which stores the parameters, which reduces gradients.

In ``estimators/`` because the cost model prices each precision and imports nothing of
``tensoropt``; ``tensoropt.precision`` re-exports it.

``training.precision`` in a job (torch-free; the estimators and the executor read the same table):

=============  ===========  ==================  ==================  ============================
precision      computes in  parameters + Adam   gradients (reduced  notes
                            state stored in     in)
=============  ===========  ==================  ==================  ============================
fp32           float32      float32             float32
bf16           bfloat16     bfloat16            bfloat16            pure: the model cast to bf16
fp16           float16      float16             float16             pure (no loss scaling)
bf16-mixed     bfloat16     float32 (master)    float32             a bf16 copy of each parameter
                                                                    is cast where it is used
fp16-mixed     float16      float32 (master)    float32             as bf16-mixed, + dynamic loss
                                                                    scaling
=============  ===========  ==================  ==================  ============================

The mixed modes are FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``: the cast
to the compute dtype is an op of the autograd graph, so the gradient flows back through it and
lands on the float32 master parameter in float32; it is all-reduced in float32. Activations,
the parameter copies ops save for backward and the parameters a ZeRO-3 node gathers are in the
compute dtype.

``training.dtype`` is the older spelling: float32 -> fp32, bfloat16 -> bf16, float16 -> fp16.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DTYPE_ALIASES", "PRECISIONS", "Precision", "get_precision", "precision_of_dtype"]


@dataclass(frozen=True)
class Precision:
    """One training precision (see the module table).

    Example:
        >>> p = get_precision("bf16-mixed")
        >>> p.compute_dtype, p.param_dtype, p.grad_dtype, p.mixed
        ('bfloat16', 'float32', 'float32', True)
    """

    name: str
    compute_dtype: str
    """dtype of activations and of the parameter copies the ops compute with."""
    param_dtype: str
    """dtype of the stored (master) parameters and of the optimizer state."""
    grad_dtype: str
    """dtype of the parameters' gradients, and of their all-reduce / reduce-scatter."""
    loss_scaling: bool = False
    """Whether the loss is scaled before backward (dynamic, as ``torch.amp.GradScaler``)."""

    @property
    def mixed(self) -> bool:
        """Whether parameters are stored in another dtype than the one ops compute in.

        Example:
            >>> get_precision("fp32").mixed, get_precision("fp16-mixed").mixed
            (False, True)
        """
        return self.param_dtype != self.compute_dtype

    def stored_dtypes(self, op_dtype: str) -> tuple[str, str]:
        """(parameter dtype, gradient dtype) of an operator captured in ``op_dtype``.

        Pure precisions store parameters as the graph computes with them (``op_dtype``: a model
        may keep some layers in another dtype); mixed ones store the float32 master.

        Example:
            >>> get_precision("bf16-mixed").stored_dtypes("bfloat16")
            ('float32', 'float32')
            >>> get_precision("fp32").stored_dtypes("float16")
            ('float16', 'float16')
        """
        if self.mixed:
            return self.param_dtype, self.grad_dtype
        return op_dtype, op_dtype


PRECISIONS: dict[str, Precision] = {
    "fp32": Precision("fp32", "float32", "float32", "float32"),
    "bf16": Precision("bf16", "bfloat16", "bfloat16", "bfloat16"),
    "fp16": Precision("fp16", "float16", "float16", "float16"),
    "bf16-mixed": Precision("bf16-mixed", "bfloat16", "float32", "float32"),
    "fp16-mixed": Precision("fp16-mixed", "float16", "float32", "float32", loss_scaling=True),
}
"""Every precision by name (``training.precision``)."""

DTYPE_ALIASES: dict[str, str] = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
"""``training.dtype`` -> the precision it means (pure: parameters and activations in that dtype)."""


def get_precision(name: str | Precision) -> Precision:
    """The :class:`Precision` named ``name`` (a Precision is returned as it is).

    Raises:
        ValueError: for an unknown name, listing the known ones.

    Example:
        >>> get_precision("bf16").compute_dtype
        'bfloat16'
    """
    if isinstance(name, Precision):
        return name
    try:
        return PRECISIONS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown precision {name!r}; expected one of {' | '.join(PRECISIONS)}") from None


def precision_of_dtype(dtype: str) -> str:
    """The precision name a ``training.dtype`` means.

    Example:
        >>> precision_of_dtype("bfloat16")
        'bf16'
    """
    try:
        return DTYPE_ALIASES[dtype]
    except (KeyError, TypeError):
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {' | '.join(DTYPE_ALIASES)}") from None
