"""The memory options (recompute, ZeRO-1/2/3, block_recompute/block_selective, chunked_loss), re-exported:
they live in :mod:`estimators.memory_options`.

The cost model (``estimators/``) prices the layouts they give and must not import ``tensoropt``,
so they sit at its level; this module keeps the historical import path.

Example:
    >>> from tensoropt.configspace.options import MEMORY_OPTIONS
    >>> MEMORY_OPTIONS
    ('recompute', 'zero1', 'zero2', 'zero3', 'block_recompute', 'block_selective', 'chunked_loss')
"""

from estimators.memory_options import (  # noqa: F401 - re-exported
    MEMORY_OPTIONS,
    ZERO_OPTIONS,
    base_configuration,
    check_options,
    compute_params,
    option_variants,
    state_layout,
    state_layouts,
    with_options,
    zero_layout,
)
