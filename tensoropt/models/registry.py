"""The model zoo registry: presets by name, user models by ``"package.module:factory"``."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field, replace

import torch
from torch import nn


@dataclass(frozen=True)
class ModelSpec:
    """What a job needs to know about a model besides the module itself.

    Attributes:
        name: preset name or ``"package.module:factory"``.
        task: ``"image"`` (images + class labels), ``"vector"`` (feature vectors + class labels),
            ``"lm"`` (token ids + next-token labels) or ``"custom"`` (the module makes its inputs).
        input_shape: shape of one sample (``(3, 224, 224)``, ``(1024,)``, ``(seq_len,)``).
        num_classes: classes of an image/vector task.
        vocab_size: vocabulary of an ``lm`` task.
        seq_len: sequence length of an ``lm`` task.
        default_batch_size: the batch size jobs use unless they say otherwise.
        kwargs: the factory's keyword arguments.
    """

    name: str
    task: str
    input_shape: tuple[int, ...] = ()
    num_classes: int | None = None
    vocab_size: int | None = None
    seq_len: int | None = None
    default_batch_size: int = 32
    kwargs: dict = field(default_factory=dict)


def _gpt(**kw):
    from tensoropt.models.gpt import GPT

    return GPT(**kw)


def _bert(**kw):
    from tensoropt.models.bert import BERT

    return BERT(**kw)


def _mlp(**kw):
    from tensoropt.models.mlp import MLP

    return MLP(**kw)


def _cnn(name):
    def make(**kw):
        from tensoropt.models import cnn, resnet

        return {
            "alexnet": cnn.alexnet,
            "vgg16": cnn.vgg16,
            "resnet50": resnet.resnet50,
            "wide-resnet": resnet.wide_resnet50_2,
        }[name](**kw)

    return make


_FACTORIES = {"mlp": _mlp, "gpt": _gpt, "bert": _bert}
for _n in ("alexnet", "vgg16", "resnet50", "wide-resnet"):
    _FACTORIES[_n] = _cnn(_n)


def _image(name: str, batch: int) -> ModelSpec:
    return ModelSpec(
        name, "image", (3, 224, 224), num_classes=1000, default_batch_size=batch, kwargs={"num_classes": 1000}
    )


def _lm(name: str, vocab: int, seq: int, batch: int, layers: int, width: int, heads: int) -> ModelSpec:
    kwargs = {"vocab_size": vocab, "seq_len": seq, "layers": layers, "width": width, "heads": heads}
    return ModelSpec(
        name, "lm", (seq,), vocab_size=vocab, seq_len=seq, default_batch_size=batch, kwargs=kwargs
    )


_MLP = ModelSpec(
    "mlp",
    "vector",
    (1024,),
    num_classes=1000,
    default_batch_size=64,
    kwargs={"in_features": 1024, "hidden": (4096, 4096), "num_classes": 1000},
)

PRESETS: dict[str, tuple[str, ModelSpec]] = {
    "mlp": ("mlp", _MLP),
    "alexnet": ("alexnet", _image("alexnet", 128)),
    "vgg16": ("vgg16", _image("vgg16", 64)),
    "resnet50": ("resnet50", _image("resnet50", 64)),
    "wide-resnet": ("wide-resnet", _image("wide-resnet", 64)),
    "gpt": ("gpt", _lm("gpt", 8192, 256, 8, layers=4, width=256, heads=4)),
    "gpt2-small": ("gpt", _lm("gpt2-small", 50304, 1024, 8, layers=12, width=768, heads=12)),
    "gpt-1.3b": ("gpt", _lm("gpt-1.3b", 50304, 2048, 8, layers=24, width=2048, heads=16)),
    "bert-base": ("bert", _lm("bert-base", 30522, 512, 16, layers=12, width=768, heads=12)),
}
"""name -> (factory, spec).

``gpt`` is a small GPT (4 layers, width 256) for quick runs. The GPT presets pad the GPT-2 BPE
vocabulary 50257 to 50304 (a multiple of 128, as Megatron-LM and nanoGPT do) so that vocabulary
splits divide evenly; GPT-2 small then has 124.48M parameters (124.44M with ``vocab_size=50257``).
gpt-1.3b is Megatron-LM's 1.3B configuration (24 layers, width 2048, 16 heads, 2048 tokens).
"""

_SPEC_FIELDS = {"num_classes", "vocab_size", "seq_len"}
_SPEC_ONLY = {"input_shape", "default_batch_size"}


def build_model(
    name: str, device: str | torch.device | None = None, **overrides
) -> tuple[nn.Module, ModelSpec]:
    """Build a zoo preset or a user model, with overrides of its keyword arguments.

    Args:
        name: a preset (``mlp``, ``alexnet``, ``vgg16``, ``resnet50``, ``wide-resnet``, ``gpt``,
            ``gpt2-small``, ``gpt-1.3b``, ``bert-base``) or ``"package.module:factory"`` (the
            factory returns an ``nn.Module`` whose forward takes (inputs, labels) and returns the
            loss; if it has a method ``example_inputs(batch_size)`` that is used to make inputs).
        device: where to build the parameters; ``"meta"`` builds without allocating memory.
        **overrides: factory keyword arguments (``layers=2``, ``width=128``, ``num_classes=10``);
            ``seq_len``/``vocab_size``/``num_classes``/``in_features`` also update the spec;
            ``input_shape`` (e.g. ``(3, 64, 64)``) and ``default_batch_size`` only update it.

    Returns:
        ``(module, spec)``.

    Raises:
        ValueError: unknown preset or a user model path without ``:``.

    Example:
        >>> m, spec = build_model("gpt", layers=1, width=32, heads=2, seq_len=16, vocab_size=64)
        >>> spec.task, spec.seq_len, type(m).__name__
        ('lm', 16, 'GPT')
    """
    if name in PRESETS:
        factory_name, spec = PRESETS[name]
        factory = _FACTORIES[factory_name]
        spec_only = {k: v for k, v in overrides.items() if k in _SPEC_ONLY}
        kwargs = {**spec.kwargs, **{k: v for k, v in overrides.items() if k not in _SPEC_ONLY}}
        changes = {k: v for k, v in overrides.items() if k in _SPEC_FIELDS}
        if "seq_len" in changes:
            changes["input_shape"] = (changes["seq_len"],)
        if "in_features" in overrides:
            changes["input_shape"] = (overrides["in_features"],)
        changes.update({k: tuple(v) if k == "input_shape" else v for k, v in spec_only.items()})
        spec = replace(spec, kwargs=kwargs, **changes)
    elif ":" in name:
        factory = load_factory(name, "model")
        kwargs = dict(overrides)
        spec = ModelSpec(name, "custom", kwargs=kwargs)
    else:
        raise ValueError(
            f"unknown model {name!r}: use one of {', '.join(PRESETS)} or 'package.module:factory'"
        )
    with torch.device(device) if device is not None else _nullcontext():
        model = factory(**kwargs)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model factory {name!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model, spec


def load_factory(ref: str, what: str = "factory"):
    """Import ``"package.module:name"`` and return the callable: the one loader of model factories,
    dataset and batch functions and losses named in a job.

    Args:
        ref: ``"package.module:name"``.
        what: what the callable is, for the error message (``"model"``, ``"model.loss"``, ...).

    Raises:
        ValueError: ``ref`` is not of that form, the module does not import, or it has no callable
            of that name; the message names ``ref`` and what to check.

    Example:
        >>> load_factory("tensoropt.models.resnet:resnet50").__name__
        'resnet50'
        >>> load_factory("math:sqrt")(4.0)
        2.0
    """
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{what} {ref!r} is not of the form 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(
            f"{what} {ref!r}: cannot import module {module_name!r} ({err}); "
            "check the name and that it is on PYTHONPATH"
        ) from err
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"{what} {ref!r}: module {module_name!r} has no callable {attr!r}")
    return factory


def example_inputs(
    spec: ModelSpec, batch_size: int, device: str | torch.device = "cpu", model: nn.Module | None = None
) -> tuple[torch.Tensor, ...]:
    """Example ``(inputs, labels)`` of a model for one step of ``batch_size`` samples.

    Args:
        spec: from :func:`build_model`. batch_size: samples per step (global batch).
        device: where to create them (``"meta"`` for shape-only capture).
        model: needed for ``custom`` specs: its ``example_inputs(batch_size)`` is called.

    Example:
        >>> _, spec = build_model("mlp", device="meta")
        >>> [tuple(t.shape) for t in example_inputs(spec, 4, device="meta")]
        [(4, 1024), (4,)]
    """
    if spec.task == "custom":
        if model is None or not hasattr(model, "example_inputs"):
            raise ValueError(
                f"model {spec.name!r} is a user model: give it a method example_inputs(batch_size)"
            )
        from tensoropt.models.contract import TrainingStep

        if isinstance(model, TrainingStep):  # made where they are needed (a meta batch costs nothing)
            return model.example_inputs(batch_size, device)
        return tuple(t.to(device) for t in model.example_inputs(batch_size))
    if spec.task in ("image", "vector"):
        x = torch.randn(batch_size, *spec.input_shape, device=device)
        y = torch.randint(0, spec.num_classes, (batch_size,), device=device)
        return x, y
    tokens = torch.randint(0, spec.vocab_size, (batch_size, spec.seq_len), device=device)
    labels = torch.randint(0, spec.vocab_size, (batch_size, spec.seq_len), device=device)
    return tokens, labels


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False
