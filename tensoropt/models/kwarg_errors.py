"""Which ``model.kwargs`` key a model library refused, and why, in one line.

A factory that validates its configuration (HuggingFace's configs: ``StrictDataclassFieldValidationError``
``Validation error for field 'n_embd': TypeError: Field 'n_embd' expected int, got list``) raises
its own exception types, with the library's reason on the last line. :func:`kwarg_error` finds the
key the error names and that reason, so the job's error is ``model.kwargs.n_embd: ...``, not a
traceback through the library.

Example:
    >>> kwarg_error(TypeError("Field 'n_embd' expected int, got list (value: [1, 'a'])"),
    ...             {"n_embd": [1, "a"], "n_layer": 2})
    ('n_embd', "TypeError: Field 'n_embd' expected int, got list (value: [1, 'a'])")
"""

from __future__ import annotations

import re


def kwarg_error(err: BaseException, kwargs: dict) -> tuple[str | None, str] | None:
    """``(key, reason)`` when ``err`` is about one of ``kwargs`` (key None: about the kwargs as a
    whole), else None (an error of the model's own code, whose traceback the user needs).

    The reason is the deepest error's message (a validation error chains its cause), on one line.

    Example:
        >>> kwarg_error(ValueError("unrelated"), {"a": 1}) is None
        True
        >>> kwarg_error(TypeError("f() got an unexpected keyword argument 'depth'"), {"depth": 2})[0]
        'depth'
    """
    chain = [err]
    while chain[-1].__cause__ is not None and len(chain) < 8:
        chain.append(chain[-1].__cause__)
    text = " ".join(str(e) for e in chain)
    named = [key for key in kwargs if re.search(rf"['\"`]{re.escape(str(key))}['\"`]", text)]
    validation = any("validation" in type(e).__name__.lower() for e in chain)
    if not named and not validation and not isinstance(err, TypeError):
        return None
    deepest = chain[-1]
    lines = [line.strip() for line in str(deepest).strip().splitlines() if line.strip()]
    reason = f"{type(deepest).__name__}: {lines[-1] if lines else ''}".rstrip(": ")
    return (named[0] if named else None), reason[:300]
