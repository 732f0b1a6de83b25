"""The training loop's building blocks, each pure and tested on its own: the learning-rate schedule
(:mod:`.schedule`), the optimizer with its weight-decay groups (:mod:`.optimizer`), the metrics
(:mod:`.metrics`: ``metrics.jsonl``, TensorBoard, the progress line) and the checks a run makes
before any worker starts (:mod:`.checks`). ``tensoropt run``'s loop composes them.

Example:
    >>> from tensoropt.training.schedule import lr_multiplier
    >>> lr_multiplier(0, warmup_steps=3, decay="constant", decay_steps=1, min_lr_ratio=0.0)
    0.25
"""
