"""A dataset factory for `tensoropt run --dataset run_dataset:fixed_batch` (tests/planner)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

LOG_DIR_ENV = "TENSOROPT_TEST_DATASET_LOG"
"""Folder where every call leaves a file named PID-STEP-GLOBAL_BATCH-SEED (unset: no log)."""


def fixed_batch(step: int, global_batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same batch at every step (for cpu-demo's MLP: 256 features, 16 classes), so plain
    gradient descent must lower its loss step after step; each call is logged."""
    log_dir = os.environ.get(LOG_DIR_ENV)
    if log_dir:
        (Path(log_dir) / f"{os.getpid()}-{step}-{global_batch_size}-{seed}").touch()
    gen = torch.Generator().manual_seed(1000 + seed)
    x = torch.randn(global_batch_size, 256, generator=gen)
    return x, x[:, :16].argmax(dim=1)
