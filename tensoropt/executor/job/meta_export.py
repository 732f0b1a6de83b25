"""Export the model on meta tensors, for a program that runs on the rank's device.

The executor exports a :class:`~tensoropt.executor.job.materialize.Skeleton` (parameters on meta)
with meta example inputs of the global batch's shape: no weight and no batch is allocated. The
exported graph then names ``device='meta'`` wherever the model creates a tensor (``torch.arange(t,
device=x.device)``, ``torch.zeros(..., device=...)``); :func:`retarget_device` rewrites those to
the rank's device.

Example:
    >>> from tensoropt.executor.job.data import InputSpec
    >>> from tensoropt.executor.job.materialize import build_skeleton
    >>> from tensoropt.executor.job.spec import TrainSpec
    >>> spec = TrainSpec("torch.nn:Linear", (InputSpec((2,)),), 4, {"in_features": 2, "out_features": 3})
    >>> ep = export_on_meta(build_skeleton(spec), meta_inputs(spec), torch.device("cpu"))
    >>> [n.name for n in ep.graph.nodes if n.op == "call_function"]
    ['linear']
"""

from __future__ import annotations

import torch

from tensoropt.executor.job.data import _DTYPES, load_factory
from tensoropt.executor.job.materialize import Skeleton, buffers_on_meta
from tensoropt.executor.job.program import export_program


def meta_inputs(spec) -> tuple[torch.Tensor, ...]:
    """Meta tensors shaped and typed as ``spec``'s global batch (float inputs in ``spec.dtype``).

    A dataset factory is called once for step 0 to learn its shapes (its tensors are then dropped).

    Example:
        >>> from tensoropt.executor.job.data import InputSpec
        >>> from tensoropt.executor.job.spec import TrainSpec
        >>> spec = TrainSpec("m:f", (InputSpec((3,)), InputSpec((), "int64", 5)), 8)
        >>> [(tuple(t.shape), t.dtype, t.device.type) for t in meta_inputs(spec)]
        [((8, 3), torch.float32, 'meta'), ((8,), torch.int64, 'meta')]
    """
    dtype = _DTYPES[spec.dtype]
    if spec.dataset:
        batch = load_factory(spec.dataset)(0, spec.global_batch_size, spec.seed)
        shapes = [(tuple(t.shape), t.dtype) for t in batch]
    else:
        shapes = [((spec.global_batch_size, *s.shape), _DTYPES[s.dtype]) for s in spec.inputs]
    return tuple(torch.empty(shape, dtype=dtype if d.is_floating_point else d, device="meta")
                 for shape, d in shapes)


def export_on_meta(skeleton: Skeleton, example: tuple, device: torch.device) -> torch.export.ExportedProgram:
    """Export the skeleton on meta ``example`` inputs; tensors the graph creates go to ``device``.

    Example:
        >>> # not run here: needs a job's skeleton and spec
        >>> ep = export_on_meta(skeleton, meta_inputs(spec), torch.device("cpu"))  # doctest: +SKIP
    """
    with buffers_on_meta(skeleton.module):
        ep = export_program(skeleton.module, example)
    retarget_device(ep.graph_module, device)
    return ep


def retarget_device(gm: torch.fx.GraphModule, device: torch.device) -> int:
    """Replace every ``meta`` device argument of ``gm``'s nodes by ``device``; returns how many.

    Example:
        >>> g = torch.fx.Graph()
        >>> n = g.call_function(torch.ops.aten.arange.default, (4,), {"device": torch.device("meta")})
        >>> _ = g.output(n)
        >>> gm = torch.fx.GraphModule({}, g)
        >>> retarget_device(gm, torch.device("cpu")), gm(), n.kwargs["device"]
        (1, tensor([0, 1, 2, 3]), device(type='cpu'))
    """
    count = 0

    def swap(a):
        nonlocal count
        if isinstance(a, torch.device) and a.type == "meta":
            count += 1
            return device
        if isinstance(a, (list, tuple)):
            return type(a)(swap(x) for x in a)
        return a

    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        node.args = tuple(swap(a) for a in node.args)
        node.kwargs = {k: swap(v) for k, v in node.kwargs.items()}
    if count:
        gm.recompile()
    return count
