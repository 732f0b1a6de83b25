"""Three-objective grouped prune: the Fenwick staircase (frontier/pareto3.py) against the pairwise one.

Random grouped sets shaped like a pipeline stage table in (time, state bytes, activation bytes):
time and state trade off, activations take few distinct values (the checkpointing options). Both
prunes run on the same arrays, rounds interleaved; this process's CPU seconds (the machine is shared).

Usage::

    .venv/bin/python benchmarks/pareto3.py
"""

from __future__ import annotations

import time

import numpy as np

from frontier import pareto
from frontier.pareto3 import prune3


def _case(n: int, groups: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    t = rng.random(n)
    cost = np.stack([t, rng.random(n) * (2 - t), np.round(rng.random(n) * 40) / 40], axis=1)
    return cost, rng.integers(0, groups, size=n)


def _cpu(fn, *args) -> float:
    start = time.process_time()
    fn(*args)
    return time.process_time() - start


def main() -> None:
    prune3(*_case(100, 2))  # numba compile (cached on disk after the first run)
    print("| rows | groups | kept | Fenwick CPU s | pairwise CPU s | ratio |")
    print("|---|---|---|---|---|---|")
    for n, groups in [(2_000, 4), (20_000, 16), (200_000, 64), (1_000_000, 64)]:
        cost, group = _case(n, groups)
        fast, slow = [], []
        for _ in range(2):  # interleaved rounds; the least of each
            fast.append(_cpu(prune3, cost, group))
            if n <= 200_000:
                pareto.COMPILED_PRUNE3 = False
                slow.append(_cpu(pareto.pareto_select, cost, group))
                pareto.COMPILED_PRUNE3 = True
        kept = len(prune3(cost, group))
        s = f"{min(slow):.3f}" if slow else "-"
        r = f"{min(slow) / max(min(fast), 1e-6):.0f} x" if slow else "-"
        print(f"| {n} | {groups} | {kept} | {min(fast):.3f} | {s} | {r} |")


if __name__ == "__main__":
    main()
