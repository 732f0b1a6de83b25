"""Calibration: the fit reproduces its points; `tensoropt calibrate` measures gloo and writes a profile."""

from __future__ import annotations

import random
import statistics
import subprocess
import sys

import pytest

from estimators.calibration import (
    calibrated_profile,
    fit_alpha_beta,
    fit_segments,
    segment_errors,
    summarise_s,
)
from estimators.collectives import CommModel
from estimators.profiles import Cluster, load_cluster
from tensoropt.configspace.configuration import Mesh

SIZES = [4096, 65536, 1 << 20, 4 << 20, 16 << 20]


@pytest.mark.parametrize("seed", range(5))
def test_fit_reproduces_noisy_alpha_beta_points_within_10_percent(seed):
    rng = random.Random(seed)
    alpha, beta = rng.uniform(1e-5, 1e-3), rng.uniform(1e-10, 1e-8)
    ts = [(alpha + beta * n) * rng.uniform(0.97, 1.03) for n in SIZES]
    a, b = fit_alpha_beta(SIZES, ts)
    assert a == pytest.approx(alpha, rel=0.15) and b == pytest.approx(beta, rel=0.1)
    assert max(abs(e) for e in segment_errors(fit_segments(SIZES, ts), SIZES, ts)) < 0.1


def test_two_regimes_when_one_line_cannot_fit():
    ts = [3.4e-4, 2.9e-4, 6.6e-4, 3.7e-3, 1.15e-2]  # measured gloo all_reduce, 2 procs (non-linear past 1 MB)
    segs = fit_segments(SIZES, ts)
    assert len(segs) == 2 and segs[1].min_bytes > segs[0].min_bytes
    assert statistics.median(abs(e) for e in segment_errors(segs, SIZES, ts)) < 0.1


def test_profile_from_measurements_is_monotone_and_matches_points():
    pts = {
        c: [(n, 2e-4 + k * 7e-10 * n) for n in SIZES]
        for k, c in enumerate(["all_reduce", "all_gather", "reduce_scatter", "broadcast"], start=1)
    }
    cluster = Cluster.from_dict(calibrated_profile(load_cluster("cpu-local"), 2, pts, "gloo"))
    cm = CommModel(cluster, Mesh((2, 2), ("gpu", "gpu")))
    for coll, points in pts.items():
        for n, t in points:
            assert cm.time_s(coll, n, (0,)) == pytest.approx(t, rel=0.1)
        times = [cm.time_s(coll, n, (0,)) for n in [0, 1e3, 1e5, 1e7, 1e9]]
        assert times == sorted(times)
        assert cm.time_s(coll, 1e7, (0, 1)) >= cm.time_s(coll, 1e7, (0,))  # 4 processes cost more than 2


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_calibrate_command_measures_gloo(tmp_path):
    out = tmp_path / "cal.yaml"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tensoropt.cli",
            "calibrate",
            "--nproc",
            "2",
            "--out",
            str(out),
            "--sizes",
            "4096,262144,4194304",
            "--iters",
            "5",
            "--statistic",
            "fastest",  # the least disturbed of 5: the fit's error under another job's load is the load's
            "--timeout-s",
            "200",
        ],
        capture_output=True,
        text=True,
        timeout=230,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    cluster = load_cluster(str(out))
    assert cluster.backend == "gloo"
    assert {f.collective for f in cluster.fits} == {"all_reduce", "all_gather", "reduce_scatter", "broadcast"}
    cm = CommModel(cluster, Mesh((2,), ("gpu",)))
    for coll in ("all_reduce", "all_gather"):
        times = [cm.time_s(coll, n, (0,)) for n in (4096, 262144, 4194304)]
        assert times == sorted(times) and times[0] > 0
    errors = [
        abs(float(line.split()[-1].rstrip("%")))
        for line in proc.stdout.splitlines()
        if line.split() and line.split()[0] in ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
    ]
    assert len(errors) == 12 and statistics.median(errors) < 30  # a shared machine: the median, loosely


def test_timings_are_summarised_as_asked():
    stalls = [1.0] * 7 + [4.0] * 2 + [50.0]  # a few gloo stalls and one outlier (load from elsewhere)
    assert summarise_s(stalls, "fastest") == 1.0
    assert summarise_s(stalls, "median") == 1.0
    assert summarise_s(stalls, "mean") == pytest.approx((7 + 8) / 9)  # the stalls count, the outlier not
    with pytest.raises(ValueError, match="statistic must be one of"):
        summarise_s(stalls, "best")
    with pytest.raises(ValueError, match="no timings"):
        summarise_s([], "mean")
