"""What producing a step's inputs costs: the whole global batch from one generator (before issue 16.3)
vs each rank drawing only its rows, one generator per row (executor/data.py).

    .venv/bin/python benchmarks/data_rows.py [--repeats 5]

Prints milliseconds per step for an image batch (64 x 3 x 224 x 224 float32 + labels) and a token
batch (8 x 1024 int64 ids + labels): the whole batch the old way, the whole batch row by row (the
1-process run), and one rank's half and eighth (2 and 8 processes). Run on a quiet machine for
figures to quote; the ratios in one run are comparable under load.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from tensoropt.executor.data import InputSpec, synthetic_rows

CASES = {
    "image 64x3x224x224": ([InputSpec((3, 224, 224)), InputSpec((), "int64", 1000)], 64),
    "tokens 8x1024": ([InputSpec((1024,), "int64", 50304), InputSpec((1024,), "int64", 50304)], 8),
}


def one_generator(specs: list[InputSpec], batch: int, seed: int, step: int) -> tuple:
    """The former way: the whole global batch from one generator per step."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    out = []
    for spec in specs:
        shape = (batch, *spec.shape)
        if spec.dtype.startswith("float"):
            out.append(torch.randn(shape, generator=gen))
        else:
            out.append(torch.randint(0, spec.high, shape, generator=gen))
    return tuple(out)


def timed_ms(fn, repeats: int) -> float:
    times = []
    for step in range(repeats):
        start = time.perf_counter()
        fn(step)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    header = ("batch", "one generator", "rows: all", "1/2 of rows", "1/8 of rows")
    print(f"{header[0]:22} {header[1]:>14} {header[2]:>10} {header[3]:>12} {header[4]:>12}  (ms)")
    for name, (specs, batch) in CASES.items():
        whole = timed_ms(lambda s, specs=specs, batch=batch: one_generator(specs, batch, 0, s), args.repeats)
        cells = []
        for share in (1, 2, 8):
            rows = [range(batch // share)] * len(specs)
            cells.append(timed_ms(lambda s, specs=specs, rows=rows: synthetic_rows(specs, 0, s, rows),
                                  args.repeats))
        print(f"{name:22} {whole:14.1f} {cells[0]:10.1f} {cells[1]:12.1f} {cells[2]:12.1f}")


if __name__ == "__main__":
    main()
