"""Parameters tied across pipeline stages, priced on the stages that hold them (issue 27).

A tied parameter (GPT-2's token embedding read again by the output head,
``tie_word_embeddings``) is stored once, at its first user, and the cost graph prices what the
other user reads of it on an edge between the two (:mod:`estimators.tied`). When a pipeline puts
the two users on different stages, that edge falls between stages and the runtime does what
Megatron does (:mod:`tensoropt.pipeline_runtime.tied`): each stage keeps its own copy, and once per
step, after the data-parallel average, the two copies' gradients are summed by an all-reduce
between the two stages, so both copies take the same optimizer step. So a stage graph
(:meth:`tensoropt.pipeline.search.StageSolver._stage_graph`) adds:

* on the stage of the other user (the head): the copy's state -- parameter, gradient, optimizer
  state in the user's layout -- to its memory and its parts, and to its once-per-step time the
  copy's data-parallel gradient sync and optimizer step (:func:`estimators.pipeline.tied_copy_cost`)
  and the all-reduce between the stages (:func:`estimators.pipeline.tied_all_reduce_s`);
* on the stage of the first user (the embedding): the same all-reduce, on its own gradient's
  local bytes.

Both go into the stage's ``d`` (the step's ``delta = max_s d_s``), counted ``1 / m`` per
micro-batch in the stage's solve as every once-per-step term is. A stage holding both users keeps
the cost graph's tie edge: nothing is added.

Example:
    >>> import networkx as nx
    >>> g = nx.DiGraph()
    >>> g.add_node("emb", params={"w": (8, 4)}, shared_params=[])
    >>> g.add_node("head", params={"w": (8, 4)}, shared_params=["w"])
    >>> [(t.key, t.role) for t in stage_ties(g, {"head"})], stage_ties(g, {"emb", "head"})
    ([('w', 'user')], [])
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import numpy as np

from estimators.op_costs import CostModel, param_bytes
from estimators.pipeline import tied_all_reduce_s, tied_copy_cost
from estimators.tied import tied_pairs


@dataclass(frozen=True)
class StageTie:
    """A tied parameter one of whose users a stage holds without the other.

    Attributes:
        key: the parameter's key.
        owner: its first user (stores it in the cost graph).
        user: its other user.
        role: ``"owner"`` (the stage holds ``owner``) or ``"user"`` (it holds ``user``).
    """

    key: str
    owner: str
    user: str
    role: str

    @property
    def node(self) -> str:
        """The operator of the stage the tie's terms go on."""
        return self.owner if self.role == "owner" else self.user


def stage_ties(g: nx.DiGraph, nodes: set[str], pairs: list | None = None) -> list[StageTie]:
    """The ties of the captured graph ``g`` (:func:`estimators.tied.tied_pairs`, or ``pairs`` when
    given) that cross the boundary of the stage made of ``nodes``: one of their users inside, the
    other outside.

    Example:
        >>> g = nx.DiGraph()
        >>> g.add_node("emb", params={"w": (8, 4)}, shared_params=[])
        >>> g.add_node("head", params={"w": (8, 4)}, shared_params=["w"])
        >>> stage_ties(g, {"emb"})[0].role
        'owner'
    """
    out = []
    for u, v, key in (tied_pairs(g) if pairs is None else pairs):
        if (u in nodes) != (v in nodes):
            out.append(StageTie(key, u, v, "owner" if u in nodes else "user"))
    return out


def add_tied_terms(H: nx.DiGraph, ties: list[StageTie], g: nx.DiGraph, model: CostModel, micro_batches: int,
                   devices_per_stage: int) -> None:
    """Add each tie's terms (see the module docstring) to the stage graph ``H`` (of the captured graph
    ``g``: the parameters' shapes) in place: the node's
    ``cost`` (time column: the once-per-step work ``/ m``; memory columns: the copy's state), its
    ``step_s`` and, for the copy, its state parts (``param_bytes``, ``grad_bytes``,
    ``optimizer_bytes``), each a new array.

    Example:
        >>> # tests/pipeline/test_tied_stages.py: a tied GPT's stages against the untied one's
        >>> True
        True
    """
    cluster = model.cluster
    for tie in ties:
        d, node = H.nodes[tie.node], g.nodes[tie.node]
        confs = d["configurations"]
        step = np.zeros(len(confs))
        state = {p: np.zeros(len(confs)) for p in ("param_bytes", "grad_bytes", "optimizer_bytes")}
        for c, config in enumerate(confs):
            if tie.role == "user":
                copy = tied_copy_cost(model, node, config, tie.key)
                grad = copy["grad_bytes"]
                step[c] = copy["step_s"]
                for p in state:
                    state[p][c] = copy[p]
            else:
                layout = dict(config.params).get(tie.key, ("R",) * len(model.mesh.shape))
                dtype = str(node.get("out_dtype", "float32"))
                grad = param_bytes(model, node["params"][tie.key], layout, dtype).grad
            step[c] += tied_all_reduce_s(cluster, float(grad), devices_per_stage)
        cost = d["cost"].copy()
        cost[:, 0] += step / micro_batches
        cost[:, 1:] += sum(state.values())[:, None]
        d["cost"] = cost
        d["step_s"] = np.asarray(d["step_s"], dtype=np.float64) + step
        if tie.role == "user":
            for p, extra in state.items():
                d[p] = np.asarray(d[p], dtype=np.float64) + extra
