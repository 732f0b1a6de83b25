"""HuggingFace ``transformers`` models built from configs (never weights: nothing is downloaded).

Each factory takes the keyword arguments of the model's config class and returns the training
model as HuggingFace defines it (``forward(input_ids=..., labels=...)`` returns a ``ModelOutput``
whose ``loss`` entry is the training loss). Jobs name them as ``model.factory`` with
``loss: model`` (configs/jobs/hf-*.yaml). ``use_cache`` defaults to False (a training step keeps
no key/value cache). ``transformers`` is a dev extra: it is imported when a factory is called.

Full-size shapes (build them on ``meta``): :data:`FULL_SIZE`.

Example:
    >>> import torch
    >>> m = gpt2(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    >>> ids = torch.randint(0, 64, (2, 8))
    >>> float(m(input_ids=ids, labels=ids).loss) > 0
    True
"""

from __future__ import annotations

import importlib

from torch import nn

_DEFAULTS = {"use_cache": False}

FULL_SIZE: dict[str, tuple[str, dict]] = {
    "gpt2-xl": ("gpt2", {"n_layer": 48, "n_embd": 1600, "n_head": 25, "n_positions": 1024,
                         "vocab_size": 50257}),
    "bert-large": ("bert", {"num_hidden_layers": 24, "hidden_size": 1024, "num_attention_heads": 16,
                            "intermediate_size": 4096, "vocab_size": 30522,
                            "max_position_embeddings": 512}),
    "llama-3-8b": ("llama", {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                             "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
                             "max_position_embeddings": 8192, "rope_theta": 500000.0,
                             "rms_norm_eps": 1e-5}),
    "mistral-7b": ("mistral", {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                               "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000,
                               "max_position_embeddings": 32768, "sliding_window": 4096,
                               "rms_norm_eps": 1e-5}),
}
"""Published shapes of the large models: name -> (factory in this module, config kwargs)."""


def _build(config_class: str, model_class: str, config: dict) -> nn.Module:
    """``model_class(config_class(**defaults, **config))`` from ``transformers``."""
    try:
        transformers = importlib.import_module("transformers")
    except ImportError as err:
        raise ImportError(
            "tensoropt.models.hf needs the `transformers` package (5.x): pip install 'transformers>=5,<6' "
            "(or install tensoropt's dev extra)"
        ) from err
    cfg = getattr(transformers, config_class)(**{**_DEFAULTS, **config})
    return getattr(transformers, model_class)(cfg)


def gpt2(**config) -> nn.Module:
    """``GPT2LMHeadModel`` from ``GPT2Config(**config)`` (causal LM; ``labels`` are the input ids).

    Example:
        >>> m = gpt2(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
        >>> type(m).__name__, m.config.n_layer
        ('GPT2LMHeadModel', 1)
    """
    return _build("GPT2Config", "GPT2LMHeadModel", config)


def bert(**config) -> nn.Module:
    """``BertForMaskedLM`` from ``BertConfig(**config)`` (labels -100 where a token is not masked).

    Example:
        >>> m = bert(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64,
        ...          vocab_size=64, max_position_embeddings=16)
        >>> type(m).__name__
        'BertForMaskedLM'
    """
    return _build("BertConfig", "BertForMaskedLM", config)


def llama(**config) -> nn.Module:
    """``LlamaForCausalLM`` from ``LlamaConfig(**config)``.

    Example:
        >>> m = llama(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
        ...           intermediate_size=64, vocab_size=64, max_position_embeddings=16)
        >>> type(m).__name__
        'LlamaForCausalLM'
    """
    return _build("LlamaConfig", "LlamaForCausalLM", config)


def mistral(**config) -> nn.Module:
    """``MistralForCausalLM`` from ``MistralConfig(**config)`` (sliding-window attention).

    Example:
        >>> m = mistral(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
        ...             intermediate_size=64, vocab_size=64, max_position_embeddings=16, sliding_window=4)
        >>> type(m).__name__
        'MistralForCausalLM'
    """
    return _build("MistralConfig", "MistralForCausalLM", config)


def full_size(name: str, **overrides) -> nn.Module:
    """A published large shape from :data:`FULL_SIZE` (build it under ``torch.device("meta")``).

    Example:
        >>> import torch
        >>> with torch.device("meta"):
        ...     m = full_size("bert-large")
        >>> sum(p.numel() for p in m.parameters()) > 300_000_000
        True
    """
    if name not in FULL_SIZE:
        raise ValueError(f"unknown full-size model {name!r}: use one of {', '.join(FULL_SIZE)}")
    factory, config = FULL_SIZE[name]
    return globals()[factory](**{**config, **overrides})
