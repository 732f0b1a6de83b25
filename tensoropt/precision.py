"""The training precisions (fp32 | bf16 | fp16 | bf16-mixed | fp16-mixed), re-exported: they live
in :mod:`estimators.precision` (the cost model prices them and must not import ``tensoropt``).

Example:
    >>> from tensoropt.precision import get_precision
    >>> get_precision("bf16-mixed").param_dtype
    'float32'
"""

from estimators.precision import (  # noqa: F401 - re-exported
    DTYPE_ALIASES,
    PRECISIONS,
    Precision,
    get_precision,
    precision_of_dtype,
)

__all__ = ["DTYPE_ALIASES", "PRECISIONS", "Precision", "get_precision", "precision_of_dtype"]
