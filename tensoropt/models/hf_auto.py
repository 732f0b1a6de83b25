"""Any HuggingFace ``transformers`` architecture by its class name, built from a config (no weights).

``architecture`` names a model class ``transformers`` exports (``"GPT2LMHeadModel"``,
``"ViTForImageClassification"``); the other keyword arguments go to that class's own config class
(``architecture.config_class``), with ``use_cache`` off as in :mod:`tensoropt.models.hf`. Jobs name
it as ``model.factory: tensoropt.models.hf_auto:build`` with ``loss: model``; the support matrix
(``benchmarks/model_matrix.py``, docs/models.md) builds every architecture this way.

Example:
    >>> import torch
    >>> m = build("GPT2LMHeadModel", n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    >>> ids = torch.randint(0, 64, (2, 8))
    >>> float(m(input_ids=ids, labels=ids).loss) > 0
    True
"""

from __future__ import annotations

import importlib

from torch import nn


def model_class(architecture: str) -> type:
    """The ``transformers`` class named ``architecture``; a clear error when there is none.

    Example:
        >>> model_class("BertForMaskedLM").__name__
        'BertForMaskedLM'
    """
    try:
        transformers = importlib.import_module("transformers")
    except ImportError as err:
        raise ImportError(
            "tensoropt.models.hf_auto needs the `transformers` package (5.x): "
            "pip install 'transformers>=5,<6' (or install tensoropt's dev extra)") from err
    cls = getattr(transformers, architecture, None)
    if not isinstance(cls, type) or not hasattr(cls, "config_class"):
        raise ValueError(f"model.kwargs.architecture: transformers {transformers.__version__} has no model "
                         f"class {architecture!r} (expected a name such as 'GPT2LMHeadModel')")
    return cls


def build(architecture: str, **config) -> nn.Module:
    """``architecture(architecture.config_class(use_cache=False, **config))``.

    Example:
        >>> m = build("ViTForImageClassification", hidden_size=32, num_hidden_layers=1,
        ...           num_attention_heads=2, intermediate_size=64, image_size=16, patch_size=8)
        >>> type(m).__name__, m.config.image_size
        ('ViTForImageClassification', 16)
    """
    cls = model_class(architecture)
    return cls(cls.config_class(**{"use_cache": False, **config}))
