"""The model zoo: every model's forward takes ``(inputs, labels)`` and returns the training loss.

Example:
    >>> from tensoropt.models import build_model, example_inputs
    >>> model, spec = build_model("mlp", hidden=(32,), in_features=16, num_classes=4)
    >>> float(model(*example_inputs(spec, 2))) > 0
    True
"""

from tensoropt.models.registry import PRESETS, ModelSpec, build_model, example_inputs, load_factory

__all__ = ["PRESETS", "ModelSpec", "build_model", "example_inputs", "load_factory"]
