"""Measure a plan's per-device training memory on one process, at local-shard shapes (uses torch).

The stand-in for the distributed executor while checking the memory model: every operator of
the exported program runs on plain tensors of the *local* shapes a plan gives one device, the
way a DTensor executor's ranks would hold them:

* an operand whose layout differs from its producer's output (after the folded views) is a
  new storage (DTensor redistribution copies); an unchanged one shares the producer's storage
  (folded views become reshapes, which share storage like the views they stand for);
* a partial-sum output is reduced into a new tensor (the all-reduce / reduce-scatter result);
* parameters are leaf tensors of their local shard shapes; buffers and static values (masks)
  come from one full-size run of the program.

Measured: unique storages saved by autograd (``saved_tensors_hooks``, parameters excluded) +
parameters + gradients + optimizer state after one ``step()``, all counted by storage.
"""

from __future__ import annotations

import torch

from estimators.configuration import Configuration, Mesh, local_shape
from estimators.memory import numel
from estimators.redistribution import through_view

OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.01),
    "momentum": lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-3),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3),
}


def _storage(t: torch.Tensor) -> tuple[int, int]:
    st = t.untyped_storage()
    return st.data_ptr(), st.nbytes()



def _recording_saved_storages(saved: dict[int, int]):
    """Context in which every tensor autograd saves records ``saved[storage ptr] = storage bytes``."""

    def pack(t):
        ptr, nbytes = _storage(t)
        saved[ptr] = nbytes
        return t

    return torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)

def _fit(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor of ``shape`` cut from (or zero-padded around) ``t``; values do not matter here."""
    if tuple(t.shape) == tuple(shape):
        return t
    out = t
    for d, s in enumerate(shape):
        if d < out.dim() and out.shape[d] > s:
            out = out.narrow(d, 0, s)
    if tuple(out.shape) != tuple(shape):
        out = torch.zeros(shape, dtype=t.dtype)
    return out


def _new_tensor(src: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """A fresh storage of ``shape`` that stays on ``src``'s autograd path and saves nothing."""
    if src.is_floating_point() and src.requires_grad:
        return torch.zeros(shape, dtype=src.dtype) + src.sum() * 0.0
    flat = src.reshape(-1)
    n = 1
    for s in shape:
        n *= s
    return flat.repeat(-(-n // max(1, flat.numel())))[:n].reshape(shape).clone()


def measure_plan_memory(
    graph, plan: dict[str, Configuration], mesh: Mesh, example_inputs, optimizer: str = "adamw"
) -> dict[str, int]:
    """Per-device memory of ``plan`` measured on one process at local-shard shapes.

    Args:
        graph: the OpGraph (its ``program`` is run node by node).
        plan: node name -> Configuration (every compute and input node).
        mesh: the plan's mesh.
        example_inputs: the full-size inputs the graph was captured with.
        optimizer: "sgd" | "momentum" | "adam" | "adamw".

    Returns:
        ``{"params", "grads", "optimizer", "saved", "total"}`` in bytes.

    Example:
        >>> import torch
        >>> from tensoropt.capture import capture
        >>> from tensoropt.cost_graph import replicated
        >>> g = capture(torch.nn.Linear(4, 2), (torch.randn(3, 4),))
        >>> m = Mesh((), ())
        >>> measure_plan_memory(g, {n: replicated(g.nx.nodes[n], m) for n in g.nx}, m, (torch.randn(3, 4),),
        ...                     "sgd")["saved"]  # the input x
        48
    """
    g, ep = graph.nx, graph.program
    fx_nodes = {n.name: n for n in ep.graph.nodes}
    full = _full_values(ep, example_inputs)
    params: dict[str, torch.Tensor] = {}
    values: dict[str, torch.Tensor] = {}
    saved: dict[int, int] = {}

    with _recording_saved_storages(saved):
        for name in _topo(g):
            d, conf = g.nodes[name], plan[name]
            if d["kind"] == "input":
                values[name] = _fit(
                    full[name], local_shape(tuple(d["out_shape"]), conf.output, mesh.shape)
                ).clone()
                continue
            values[name] = _run_node(d, conf, mesh, fx_nodes[name], values, params, full, g, plan)
    loss = sum(v.float().sum() for n, v in values.items() if n in graph.outputs and v.requires_grad)
    param_ptrs = {_storage(p)[0] for p in params.values()}
    saved_bytes = sum(b for p, b in saved.items() if p not in param_ptrs)
    opt = OPTIMIZERS[optimizer](list(params.values()))
    if isinstance(loss, torch.Tensor):
        loss.backward()
    opt.step()
    grads = {_storage(p.grad) for p in params.values() if p.grad is not None}
    state = {
        _storage(v) for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0
    }
    out = {
        "params": sum(_storage(p)[1] for p in params.values()),
        "grads": sum(b for _, b in grads),
        "optimizer": sum(b for _, b in state),
        "saved": saved_bytes,
    }
    out["total"] = sum(out.values())
    return out


def _topo(g):
    import networkx as nx

    return list(nx.topological_sort(g))


def _full_values(ep, example_inputs) -> dict[str, torch.Tensor]:
    """Every fx node's value in one full-size run (for buffers, static masks and inputs)."""
    env: dict[str, torch.Tensor] = {}
    gm = ep.module()
    interp = torch.fx.Interpreter(ep.graph_module)
    state = {**dict(gm.named_parameters()), **dict(gm.named_buffers())}
    sig = ep.graph_signature
    lifted = {**sig.inputs_to_parameters, **sig.inputs_to_buffers}
    consts = getattr(ep, "constants", {}) or {}
    lifted_consts = getattr(sig, "inputs_to_lifted_tensor_constants", {}) or {}
    args, user = [], iter(example_inputs)
    for n in ep.graph.nodes:
        if n.op != "placeholder":
            continue
        if n.name in lifted:
            args.append(state[lifted[n.name]].detach().clone())
        elif n.name in lifted_consts:
            args.append(consts[lifted_consts[n.name]])
        else:
            args.append(next(user))

    def run_node(node):
        result = torch.fx.Interpreter.run_node(interp, node)
        if isinstance(result, torch.Tensor):
            env[node.name] = result.detach()
        return result

    interp.run_node = run_node
    with torch.no_grad():
        interp.run(*args)
    return env


def _run_node(d, conf, mesh, fx_node, values, params, full, g, plan) -> torch.Tensor:
    """Run one OpGraph node at local shapes; returns its local output (after partial reduction)."""
    prm = dict(conf.params)

    def local_operand(entry_index: int) -> torch.Tensor:
        entry = d["inputs"][entry_index]
        src = values[entry["source"]]
        want = local_shape(tuple(entry["shape"]), tuple(conf.inputs[entry_index]), mesh.shape)
        src_layout = tuple(plan[entry["source"]].output)
        gathered, translated = through_view(
            src_layout, entry.get("dim_map"), len(g.nodes[entry["source"]]["out_shape"])
        )
        same = gathered == src_layout and translated == tuple(conf.inputs[entry_index])
        if same and src.numel() == numel(want):
            return src.reshape(want)
        return _new_tensor(src, want)

    def tensor_for(op: dict, a) -> torch.Tensor:
        if op["role"] == "input":
            return local_operand(op["index"])
        if op["role"] == "param":
            key = op["key"]
            if key not in params:
                shape = local_shape(
                    tuple(d["params"][key]), tuple(prm.get(key, ("R",) * len(mesh.shape))), mesh.shape
                )
                params[key] = torch.randn(
                    shape, dtype=full[a.name].dtype if a.name in full else None, requires_grad=True
                )
            return params[key]
        return local_buffer(full[a.name], d, prm, mesh)

    args, kwargs = call_arguments(fx_node, d["operands"], tensor_for)
    out = fx_node.target(*args, **kwargs)
    if isinstance(out, (tuple, list)):
        out = out[0]
    if conf.partial_axes:
        want = local_shape(tuple(d["out_shape"]), tuple(conf.output), mesh.shape)
        out = _new_tensor(out, want)
    return out


def call_arguments(fx_node, operands: list[dict], tensor_for) -> tuple[list, dict]:
    """An fx node's args/kwargs with each tensor argument replaced by ``tensor_for(operand, fx_arg)``.

    ``operands`` is the OpGraph node's ``operands`` list (one entry per tensor argument, in the
    order args then kwargs are walked), so operand roles (input / param / buffer) line up.

    Example:
        >>> call_arguments(type("N", (), {"args": (1, [2]), "kwargs": {}})(), [], None)
        ([1, [2]], {})
    """
    it = iter(operands)

    def replace(a):
        if isinstance(a, torch.fx.Node):
            return tensor_for(next(it), a)
        if isinstance(a, (list, tuple)):
            return type(a)(replace(x) for x in a)
        return a

    return [replace(a) for a in fx_node.args], {k: replace(v) for k, v in fx_node.kwargs.items()}


def local_buffer(value: torch.Tensor, d: dict, prm: dict, mesh: Mesh) -> torch.Tensor:
    """A buffer's local shard: laid out like a parameter of the same shape (BN running stats), else whole."""
    for key, shape in d["params"].items():
        if tuple(shape) == tuple(value.shape) and key in prm:
            return _fit(value, local_shape(tuple(shape), tuple(prm[key]), mesh.shape)).clone()
    return value




def measure_model_memory(model: torch.nn.Module, example_inputs, optimizer: str = "adamw") -> dict[str, int]:
    """Memory of one training step of the unsplit model, measured the same way (one device, eager).

    Example:
        >>> measure_model_memory(torch.nn.Linear(4, 2), (torch.randn(3, 4),), "sgd")["saved"]
        48
    """
    params = [p for p in model.parameters() if p.requires_grad]
    saved: dict[int, int] = {}

    with _recording_saved_storages(saved):
        out = model(*example_inputs)
    param_ptrs = {_storage(p)[0] for p in params}
    saved_bytes = sum(b for p, b in saved.items() if p not in param_ptrs)
    opt = OPTIMIZERS[optimizer](params)
    out.float().sum().backward()
    opt.step()
    state = {
        _storage(v) for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0
    }
    res = {
        "params": sum(_storage(p)[1] for p in params),
        "grads": sum(_storage(p.grad)[1] for p in params if p.grad is not None),
        "optimizer": sum(b for _, b in state),
        "saved": saved_bytes,
    }
    res["total"] = sum(res.values())
    return res
