"""The job's optimizer over named parameters, with the ``no_decay`` weight-decay groups.

``optimizer: {name, lr, betas, eps, momentum, weight_decay, no_decay}`` (:class:`tensoropt.config.
OptimizerConfig`). A parameter whose name contains one of the ``no_decay`` words (``bias``,
``norm``, ``embedding``, ...) goes into a second group with ``weight_decay: 0``; a word that names
no parameter is an error before the run (:func:`unmatched_words`), not a silent no-op.

Example:
    >>> import torch
    >>> from tensoropt.config import OptimizerConfig
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2))
    >>> section = OptimizerConfig(name="adamw", no_decay=["bias", "1."])
    >>> opt = build_optimizer(model.named_parameters(), section)
    >>> [(len(g["params"]), g["weight_decay"]) for g in opt.param_groups]
    [(1, 0.01), (3, 0.0)]
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = ["build_optimizer", "decay_groups", "unmatched_words"]


def _no_decay(name: str, words: Iterable[str]) -> bool:
    return any(w in name for w in words)


def unmatched_words(names: Iterable[str], words: Iterable[str]) -> list[str]:
    """The ``no_decay`` words no parameter name contains.

    Example:
        >>> unmatched_words(["fc.weight", "fc.bias"], ["bias", "norm"])
        ['norm']
    """
    names = list(names)
    return [w for w in words if not any(w in n for n in names)]


def decay_groups(named_parameters: Iterable[tuple[str, torch.Tensor]], weight_decay: float,
                 no_decay: Iterable[str]) -> list[dict]:
    """Param groups: the decayed parameters, then the ``no_decay`` ones with ``weight_decay: 0``
    (one group when ``no_decay`` is empty; a group left empty is dropped).

    Example:
        >>> w, b = torch.nn.Parameter(torch.ones(2, 2)), torch.nn.Parameter(torch.ones(2))
        >>> [(len(g["params"]), g["weight_decay"]) for g in decay_groups([("w", w), ("b", b)], 0.1, ["b"])]
        [(1, 0.1), (1, 0.0)]
    """
    words = list(no_decay)
    named = list(named_parameters)
    decayed = [p for n, p in named if not _no_decay(n, words)]
    plain = [p for n, p in named if _no_decay(n, words)]
    groups = [{"params": decayed, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def build_optimizer(named_parameters: Iterable[tuple[str, torch.Tensor]], section) -> torch.optim.Optimizer:
    """The ``torch.optim`` optimizer the job's ``optimizer`` section describes.

    sgd and momentum: ``torch.optim.SGD`` (momentum 0 / ``section.momentum``); adam: ``Adam``; adamw:
    ``AdamW`` (both with ``betas`` and ``eps``). Parameters are the model's own (plain tensors or
    DTensors, e.g. ``pm.named_parameters()`` of ``tensoropt.parallelize``).

    Example:
        >>> from tensoropt.config import OptimizerConfig
        >>> w = torch.nn.Parameter(torch.ones(1))
        >>> type(build_optimizer([("w", w)], OptimizerConfig(name="momentum"))).__name__
        'SGD'
    """
    groups = decay_groups(named_parameters, section.weight_decay, section.no_decay)
    if section.name in ("sgd", "momentum"):
        return torch.optim.SGD(groups, lr=section.lr, momentum=section.momentum or 0.0)
    cls = torch.optim.Adam if section.name == "adam" else torch.optim.AdamW
    return cls(groups, lr=section.lr, betas=tuple(section.betas), eps=section.eps)
