"""Why ``torch.export`` could not trace a model, and the advice that matches that cause.

An error raised while tracing falls in one of four kinds, read from torch's message:

* ``size``: a tensor too large to index or allocate (``numel: integer multiplication overflow``,
  ``Storage size calculation overflowed``): the inputs' shapes or the batch are too large;
* ``shapes``: operands whose shapes disagree (``Expected input batch_size (256) to match target
  batch_size (8)``, ``The size of tensor a (4) must match ...``): the inputs' shapes disagree with
  each other or with the model;
* ``data``: control flow on tensor values (``.item()``, a guard on a data-dependent value);
* ``other``.

:func:`advice` gives each kind's "What to do" line; :func:`clean_reason` drops the C++ frames
(``Exception raised from ... frame #0: ...``) some torch errors carry.

Example:
    >>> trace_kind(RuntimeError("numel: integer multiplication overflow"))
    'size'
    >>> trace_kind(ValueError("Expected input batch_size (256) to match target batch_size (8)."))
    'shapes'
"""

from __future__ import annotations

import re

_SIZE = re.compile(r"overflow|can't allocate|cannot allocate|out of memory|too large|exceeds.*int64",
                   re.IGNORECASE)
_SHAPES = re.compile(r"to match target batch_size|must match the size|shapes cannot be multiplied|"
                     r"is invalid for input of size|size mismatch|expected size|sizes of tensors must match|"
                     r"expected .*shape|shape .* does not match|doesn't match the broadcast shape|"
                     r"must match except in dimension|The size of tensor a", re.IGNORECASE)
_DATA = re.compile(r"data.dependent|GuardOnDataDependent|\.item\(\)|nonzero|unbacked", re.IGNORECASE)

ADVICE = {
    "size": "What to do: a tensor of the training step is too large to index or allocate; reduce the "
            "inputs' shapes (model.inputs.<name>.shape, model.input_shape) or training.global_batch_size.",
    "shapes": "What to do: the inputs' shapes disagree with each other or with the model; make "
              "model.inputs.<name>.shape (and model.targets.shape) the per-sample shapes the model's "
              "forward expects (e.g. labels of the same length as input_ids for a language model).",
    "data": "What to do: torch.export needs a forward whose control flow does not depend on tensor "
            "values. Remove data-dependent Python branches/loops (`if x.sum() > 0`, `.item()`, "
            "`.tolist()`, `nonzero()`), or express them with torch.cond / torch.where.",
    "other": "What to do: torch.export needs a forward whose control flow does not depend on tensor values. "
             "Remove data-dependent Python branches/loops (`if x.sum() > 0`, `.item()`, `.tolist()`, "
             "`nonzero()`), or express them with torch.cond / torch.where; avoid Python side effects "
             "(printing tensors, mutating globals); and pass representative example inputs (the batch size, "
             "sequence length and dtypes used for training).",
}


def trace_kind(err: BaseException) -> str:
    """``size``, ``shapes``, ``data`` or ``other``: what ``err`` (or an error it chains) is about.

    Example:
        >>> trace_kind(RuntimeError("Could not guard on data-dependent expression u0 > 0"))
        'data'
    """
    text = " ".join(str(e) for e in _chain(err))
    for kind, pattern in (("size", _SIZE), ("shapes", _SHAPES), ("data", _DATA)):
        if pattern.search(text):
            return kind
    return "other"


def advice(kind: str) -> str:
    """The "What to do" line of a trace error of ``kind``.

    Example:
        >>> advice("shapes").startswith("What to do: the inputs' shapes disagree")
        True
    """
    return ADVICE.get(kind, ADVICE["other"])


def clean_reason(text: str, max_lines: int = 12) -> list[str]:
    """torch's message as lines, without C++ stack frames, at most ``max_lines``.

    Example:
        >>> clean_reason("bad size\\nException raised from f at a.cpp:1 (most recent call first):\\n"
        ...              "frame #0: c10::Error::Error() + 0x1")
        ['bad size']
    """
    lines = []
    for line in str(text).strip().splitlines():
        if line.startswith("Exception raised from") or re.match(r"\s*frame #\d+", line):
            break
        lines.append(line)
    return lines[:max_lines]


def _chain(err: BaseException) -> list[BaseException]:
    chain = [err]
    while (chain[-1].__cause__ or chain[-1].__context__) is not None and len(chain) < 8:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    return chain
