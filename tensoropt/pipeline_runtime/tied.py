"""Weights tied across pipeline stages at run time: one copy per stage, gradients summed once per step.

A parameter two stages read (GPT-2's token embedding on the first stage, read again by the output
head on the last: ``tie_word_embeddings``) is cut into both stage modules
(:func:`tensoropt.pipeline_runtime.stage_modules.cut_stages` records it: :func:`tied_parameters`),
each under the key its stage reads it by (the model's own name), both from the same initial value.
Once per step, after the data-parallel average, :class:`TiedGradients` sums the copies' gradients
with one all-reduce between the ranks holding them (replica ``d`` of each of those stages: the
pipeline group when the tie spans every stage, as with 2 stages), so every copy holds the gradient
one process computes (the sum of both uses') and takes the same optimizer step: the copies stay
equal, as Megatron keeps its embedding and head copies. The stages of one rank (interleaved
schedules) that read the same tensor share one ``nn.Parameter`` instead (:func:`share_on_rank`):
their gradients add up in it. The planner prices the same work
(:mod:`tensoropt.pipeline.tied_stages`).

Example:
    >>> from torch import fx, nn
    >>> root = nn.Module(); root.w = nn.Parameter(torch.ones(2)); root.b = nn.Parameter(torch.ones(2))
    >>> tied_parameters(root, [{"w", "b"}, {"w"}])
    [{0: 'w', 1: 'w'}]
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn


def tied_parameters(root: nn.Module, reads: list[set[str]]) -> list[dict[int, str]]:
    """The parameters of ``root`` that several stages read: per tensor, stage -> the key that stage
    reads it by (``reads[s]``: the attribute targets stage ``s`` reads; aliases of one tensor under
    other names count as the same parameter).

    Example:
        >>> root = nn.Module(); root.a = nn.Linear(2, 2, bias=False); root.b = nn.Linear(2, 2, bias=False)
        >>> root.b.weight = root.a.weight
        >>> tied_parameters(root, [{"a.weight"}, {"b.weight"}])
        [{0: 'a.weight', 1: 'b.weight'}]
    """
    tensor_of = {k: id(p) for k, p in root.named_parameters(remove_duplicate=False)}
    by_tensor: dict[int, dict[int, str]] = {}
    for s, targets in enumerate(reads):
        for target in sorted(targets):
            if target in tensor_of:
                by_tensor.setdefault(tensor_of[target], {}).setdefault(s, target)
    return [stages for stages in by_tensor.values() if len(stages) > 1]


def share_on_rank(modules: dict[int, nn.Module], ties: list[dict[int, str]]) -> None:
    """Make the stages of one rank (``modules``: virtual stage -> its module) that read the same
    tied tensor hold one ``nn.Parameter`` (the first stage's), so their gradients add up in it.

    Example:
        >>> a, b = nn.Linear(2, 2), nn.Linear(2, 2)
        >>> share_on_rank({0: a, 3: b}, [{0: "weight", 3: "weight"}])
        >>> a.weight is b.weight
        True
    """
    for tie in ties:
        here = [(s, key) for s, key in sorted(tie.items()) if s in modules]
        if len(here) < 2:
            continue
        s0, k0 = here[0]
        shared = modules[s0].get_parameter(k0)
        for s, key in here[1:]:
            owner_path, _, name = key.rpartition(".")
            owner = modules[s].get_submodule(owner_path) if owner_path else modules[s]
            owner._parameters[name] = shared


class TiedGradients:
    """The once-per-step sum of tied copies' gradients across this rank's pipeline peers.

    Args:
        ties: :func:`tied_parameters` of the plan's (virtual) stages, the same on every rank.
        virtual_stages: the stages this rank runs.
        num_stages: pipeline ranks ``p`` (virtual stage ``v`` runs on pipeline rank ``v % p``).
        dp_index, dp: this rank's replica and the replicas per stage (ranks are stage-major).
        pp_group: the process group of this replica's pipeline ranks (the mesh's ``pp``).
        timeout_s: the limit of every collective of a group made here.

    Collective at construction: every rank makes the same groups, in the same order.

    Example:
        >>> # not run here: needs a process group (tests/pipeline_runtime/test_tied_runs.py)
        >>> tied = TiedGradients(ties, [0], 2, 0, 1, pp_group)  # doctest: +SKIP
        >>> tied.all_reduce(module)  # doctest: +SKIP
    """

    def __init__(self, ties: list[dict[int, str]], virtual_stages: list[int], num_stages: int,
                 dp_index: int, dp: int, pp_group=None, timeout_s: float = 120.0):
        self.groups: list[tuple[object, list[str]]] = []
        """(process group, this rank's keys summed over it), one per set of pipeline ranks."""
        self.uncounted: list[str] = []
        """This rank's keys of copies that a norm over every stage leaves out (the tie's first stage
        counts it)."""
        mine = set(virtual_stages)
        by_ranks: dict[tuple[int, ...], list[dict[int, str]]] = {}
        for tie in ties:
            ranks = tuple(sorted({s % num_stages for s in tie}))
            if len(ranks) > 1:
                by_ranks.setdefault(ranks, []).append(tie)
            first = min(tie)
            self.uncounted += [tie[s] for s in mine & set(tie) if first not in mine]
        for pp_ranks, group_ties in sorted(by_ranks.items()):
            keys = sorted({tie[s] for tie in group_ties for s in tie if s in mine})
            group = pp_group
            if len(pp_ranks) < num_stages or pp_group is None:
                for d in range(dp):  # every rank makes every group (new_group is collective)
                    made = dist.new_group([r * dp + d for r in pp_ranks],
                                          timeout=timedelta(seconds=timeout_s))
                    if d == dp_index:
                        group = made
            if keys:
                self.groups.append((group, keys))

    def all_reduce(self, module: nn.Module) -> None:
        """Sum this rank's tied copies' gradients with their peers' (one flat all-reduce per group),
        in place; a copy without a gradient contributes zeros.

        Example:
            >>> # not run here: a collective
            >>> tied.all_reduce(runtime.module)  # doctest: +SKIP
        """
        params = dict(module.named_parameters())
        for group, keys in self.groups:
            grads = []
            for key in keys:
                p = params[key]
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                grads.append(p.grad)
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=group)
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()

    def counted(self, module: nn.Module) -> list[nn.Parameter]:
        """``module``'s parameters a gradient norm over every stage counts: all but the copies whose
        first stage is another rank's (each tied gradient once, as on one process).

        Example:
            >>> # not run here
            >>> clip_across_stages(params, 1.0, group, counted=tied.counted(module))  # doctest: +SKIP
        """
        skip = set(self.uncounted)
        return [p for k, p in module.named_parameters() if k not in skip]
