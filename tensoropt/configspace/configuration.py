"""The configuration data model, re-exported: it lives in :mod:`estimators.configuration`.

The cost model (``estimators/``) prices configurations and must not import ``tensoropt``, so the
data model sits at its level; this module keeps the historical import path.

Example:
    >>> from tensoropt.configspace.configuration import Configuration, Mesh
    >>> Mesh((2,), ("gpu",)).num_devices
    2
"""

from estimators.configuration import (  # noqa: F401 - re-exported
    PARALLEL_DIMS,
    Configuration,
    Layout,
    Mesh,
    local_shape,
    make_label,
    parse_label,
    shard_dim,
)
