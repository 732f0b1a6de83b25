"""Shared setup of the known-optimum tests: the baseline spaces live in benchmarks/reproduce_baselines.py."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
