"""Names of the dims of each node's output (``dim_names``), from the parallel-dim vocabulary.

``dim_names[d]`` is ``"batch"``, ``"seq"``, ``"heads"``, ``"out"``, ``"spatial"``, ... or ``None``
when the dim has no parallel meaning. Inputs name dim 0 ``batch`` (and dim 1 ``seq`` for 2-D
integer token ids and for 3-D inputs ``[B, T, C]``); each kind derives its names from its
operands' names mapped through the edges' dim maps. The configuration space uses them to name
the splits of shape-preserving ops.
"""

from __future__ import annotations

import networkx as nx

from tensoropt.capture.equations import matmul_equation


def _operand_names(g: nx.DiGraph, entry: dict) -> list[str | None]:
    src = g.nodes[entry["source"]].get("dim_names") or []
    names: list[str | None] = [None] * len(entry["shape"])
    for d, m in enumerate(entry["dim_map"]):
        if m is not None and d < len(src) and m < len(names):
            names[m] = src[d]
    return names


def _first_full_rank(g, data) -> list[str | None] | None:
    out = data["out_shape"]
    for entry in data["inputs"]:
        if tuple(entry["shape"]) == tuple(out):
            return _operand_names(g, entry)
    for entry in data["inputs"]:
        if len(entry["shape"]) == len(out):
            return _operand_names(g, entry)
    return None


def output_dim_names(g: nx.DiGraph, node: str) -> list[str | None]:
    """Dim names of ``node``'s output (its operands must be named already).

    Example:
        >>> g = nx.DiGraph()
        >>> g.add_node("x", kind="input", out_shape=(4, 8), out_dtype="int64", inputs=[])
        >>> output_dim_names(g, "x")
        ['batch', 'seq']
    """
    data = g.nodes[node]
    kind, out = data["kind"], tuple(data["out_shape"])
    rank = len(out)
    if rank == 0:
        return []
    if kind == "input":
        names: list[str | None] = ["batch"] + [None] * (rank - 1)
        if (rank == 2 and data["out_dtype"].startswith(("int", "uint"))) or rank == 3:
            names[1] = "seq"  # token ids [B, T], or embedded sequences [B, T, C]
        return names
    if kind in ("conv2d", "pool", "adaptive_pool", "batch_norm", "group_norm") and rank == 4:
        return ["batch", "out", "spatial", "spatial"]
    if kind == "sdpa" and rank == 4:
        return ["batch", "heads", "seq", None]
    if kind in ("linear", "matmul"):
        return _matmul_names(g, data)
    if kind == "embedding":
        idx = [e for e in data["inputs"]]
        lead = _operand_names(g, idx[0]) if idx else [None] * (rank - 1)
        if not idx and rank == 2:
            lead = ["seq"]
        return list(lead) + ["out"]
    if kind == "reduce":
        full = _first_full_rank(g, data) or []
        src = _operand_names(g, data["inputs"][0]) if data["inputs"] else []
        dims = set(data["attrs"].get("dims", []))
        if data["attrs"].get("keepdim"):
            return (
                [None if d in dims else n for d, n in enumerate(src)] if len(src) == rank else [None] * rank
            )
        kept = [n for d, n in enumerate(src) if d not in dims]
        return kept if len(kept) == rank else (full if len(full) == rank else [None] * rank)
    if kind == "stack" and data["inputs"] and len(data["inputs"][0]["shape"]) == rank - 1:
        src = _operand_names(g, data["inputs"][0])  # the new dim has no name; the others are the operands'
        new = data["attrs"].get("dim", 0)
        return src[:new] + [None] + src[new:]
    names = _first_full_rank(g, data)
    if names is not None:
        return names
    return ["batch"] + [None] * (rank - 1)


def _matmul_names(g, data) -> list[str | None]:
    shapes = [o["shape"] for o in data["operands"]]
    eq, (pa, pb), _ = matmul_equation(data["op"], shapes, data["attrs"])
    rank = len(data["out_shape"])
    if not eq:
        return ["batch"] + [None] * (rank - 1)
    lhs, out_letters = eq.split("->")
    la, lb = lhs.split(",")
    roles = matmul_letter_roles(la, lb, out_letters)
    a = data["operands"][pa]
    src = _operand_names(g, data["inputs"][a["index"]]) if a["role"] == "input" else [None] * len(la)
    names = []
    for ch in out_letters:
        role = roles.get(ch)
        if role == "seq" and ch in la and src[la.index(ch)] in ("batch", "seq"):
            role = src[la.index(ch)]
        names.append(role)
    return names


def matmul_letter_roles(la: str, lb: str, out: str) -> dict[str, str]:
    """Parallel-dim name of each letter of a two-factor einsum (first occurrence wins).

    Output letters in both factors: ``batch`` then ``heads``; in the first factor only: ``batch``
    when it is the first factor's leading dim and no batch exists, else ``seq``; in the second
    factor only: ``out``; in both factors but not the output: ``in`` (a reduction).

    Example:
        >>> matmul_letter_roles("abk", "ck", "abc")
        {'a': 'batch', 'b': 'seq', 'c': 'out', 'k': 'in'}
        >>> matmul_letter_roles("abck", "abkd", "abcd")
        {'a': 'batch', 'b': 'heads', 'c': 'seq', 'd': 'out', 'k': 'in'}
    """
    roles: dict[str, str] = {}
    used: set[str] = set()

    def give(ch, name):
        if name not in used:
            roles[ch] = name
            used.add(name)

    for ch in out:
        if ch in la and ch in lb:
            give(ch, "batch" if "batch" not in used else "heads")
    for ch in out:
        if ch in roles:
            continue
        if ch in la and ch not in lb:
            give(ch, "batch" if ch == la[0] and "batch" not in used else "seq")
        elif ch in lb and ch not in la:
            give(ch, "out")
    for ch in la:
        if ch in lb and ch not in out:
            give(ch, "in")
    return roles


def assign_dim_names(g: nx.DiGraph) -> None:
    """Set ``dim_names`` on every node, in topological order."""
    for node in nx.topological_sort(g):
        g.nodes[node]["dim_names"] = output_dim_names(g, node)
