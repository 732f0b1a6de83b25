"""Fit alpha-beta collective models to measured timings and write them into a cluster profile (torch-free).

``tensoropt calibrate`` measures (bytes, seconds) points per collective with the real backend
(:mod:`tensoropt.commands.calibrate`); this module fits ``time_s = alpha_s + beta_s_per_byte * n``
by least squares on *relative* error (weights 1/t, so the latency-bound small sizes count as
much as the bandwidth-bound large ones), and turns the fits into a profile: the fits themselves
(used where collective and group size match) and the link's per-step latency and bandwidth
derived from the all-reduce fit through the ring formula (used for other group sizes).
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence

from estimators.collectives import ring_coefficients
from estimators.profiles import Cluster, CollectiveFit, cluster_to_dict

STATISTICS = ("mean", "median", "fastest")
"""How repeated timings are summarised (:func:`summarise_s`)."""


def summarise_s(times: list[float], statistic: str) -> float:
    """One figure from repeated timings: ``mean`` (slowest 10 % left out), ``median`` or ``fastest``.

    A step's time is a sum of operators and collectives, so its average is the sum of their
    averages: ``mean`` is what predicts measured step times where timings scatter (gloo on a
    shared CPU host stalls a few ms on a fraction of the collectives); ``fastest`` is the best
    case, right for a quiet cluster and for comparing with datasheets.

    Example:
        >>> summarise_s([2.0] * 9 + [100.0], "mean"), summarise_s([3.0, 1.0, 2.0], "median")
        (2.0, 2.0)
    """
    if not times:
        raise ValueError("summarise_s: no timings")
    if statistic == "fastest":
        return min(times)
    ordered = sorted(times)
    if statistic == "median":
        n = len(ordered)
        return ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])
    if statistic == "mean":
        kept = ordered[: max(1, len(ordered) - len(ordered) // 10)]
        return sum(kept) / len(kept)
    raise ValueError(f"summarise_s: statistic must be one of {', '.join(STATISTICS)}, got {statistic!r}")


def fit_alpha_beta(nbytes: Sequence[float], times_s: Sequence[float]) -> tuple[float, float]:
    """Least-squares (relative error) fit of ``t = alpha + beta * n``; both kept >= 0.

    Example:
        >>> a, b = fit_alpha_beta([1e3, 1e6, 1e7], [1e-4 + 1e-9 * n for n in (1e3, 1e6, 1e7)])
        >>> round(a * 1e4, 6), round(b * 1e9, 6)
        (1.0, 1.0)
    """
    import numpy as np  # here: the command line reads STATISTICS without loading numpy

    n = np.asarray(nbytes, dtype=np.float64)
    t = np.asarray(times_s, dtype=np.float64)
    if n.shape != t.shape or n.size < 2:
        raise ValueError("need at least two (bytes, seconds) points of equal length to fit alpha and beta")
    if np.any(t <= 0):
        raise ValueError("measured times must be positive")
    w = 1.0 / t
    a_mat = np.stack([np.ones_like(n), n], axis=1) * w[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(a_mat, t * w, rcond=None)
    if alpha < 0:  # refit through the origin
        alpha, beta = 0.0, float(np.sum(w * w * n * t) / np.sum(w * w * n * n))
    if beta < 0:
        alpha, beta = float(np.sum(w * w * t) / np.sum(w * w)), 0.0
    return float(alpha), float(beta)


def fit_segments(
    nbytes: Sequence[float], times_s: Sequence[float], tolerance: float = 0.1
) -> list[CollectiveFit]:
    """One alpha-beta fit, or two size regimes when one line misses a point by more than ``tolerance``.

    Returns fits with placeholder collective/nproc/level (``calibrated_profile`` fills them);
    the regime split is the one with the smallest worst relative error, evaluated with the
    profile's rule (the largest applicable fit).

    Example:
        >>> ns = [4e3, 6.4e4, 1e6, 4e6, 1.6e7]
        >>> ts = [3e-4, 3.2e-4, 6e-4, 4e-3, 1.3e-2]  # gloo-like: a jump past 1 MB
        >>> len(fit_segments(ns, ts)), max(abs(e) for e in segment_errors(fit_segments(ns, ts), ns, ts)) < 0.1
        (2, True)
    """
    order = sorted(range(len(nbytes)), key=lambda i: nbytes[i])
    ns = [float(nbytes[i]) for i in order]
    ts = [float(times_s[i]) for i in order]
    one = [CollectiveFit("?", 0, "gpu", *fit_alpha_beta(ns, ts))]
    best, best_err = one, max(abs(e) for e in segment_errors(one, ns, ts))
    if best_err <= tolerance:
        return best
    for k in range(2, len(ns) - 1):
        lo = CollectiveFit("?", 0, "gpu", *fit_alpha_beta(ns[:k], ts[:k]))
        hi = CollectiveFit("?", 0, "gpu", *fit_alpha_beta(ns[k:], ts[k:]), min_bytes=ns[k])
        err = max(abs(e) for e in segment_errors([lo, hi], ns, ts))
        if err < best_err:
            best, best_err = [lo, hi], err
    return best


def segment_errors(
    fits: Sequence[CollectiveFit], nbytes: Sequence[float], times_s: Sequence[float]
) -> list[float]:
    """Relative error at each point of the piecewise model (largest applicable fit).

    Example:
        >>> segment_errors([CollectiveFit("?", 0, "gpu", 1.0, 0.0)], [5.0], [2.0])
        [-0.5]
    """
    out = []
    for n, t in zip(nbytes, times_s):
        model = max(f.time_s(n) for f in fits if f.min_bytes <= n)
        out.append((model - t) / t)
    return out


def fit_errors(fit: CollectiveFit, nbytes: Sequence[float], times_s: Sequence[float]) -> list[float]:
    """Relative error of the fit at each measured point.

    Example:
        >>> fit_errors(CollectiveFit("all_reduce", 2, "gpu", 1.0, 0.0), [1, 2], [1.0, 2.0])
        [0.0, -0.5]
    """
    return [(fit.time_s(n) - t) / t for n, t in zip(nbytes, times_s)]


def calibrated_profile(
    base: Cluster,
    nproc: int,
    measurements: dict[str, list[tuple[float, float]]],
    backend: str,
    name: str | None = None,
    statistic: str = "mean",
) -> dict:
    """A cluster profile mapping (YAML-ready) with ``base``'s hardware and the measured fits.

    Args:
        base: the cluster the measurements refine (its device and node layout are kept).
        nproc: processes the collectives ran on (one node: level "gpu").
        measurements: collective -> [(bytes, seconds), ...], each the ``statistic`` of repeated timings.
        backend: "gloo" or "nccl".
        name: profile name (default: base name + "-calibrated").
        statistic: how the timings were summarised (``mean``, ``median``, ``fastest``), for the sources.

    Example:
        >>> from estimators.profiles import load_cluster
        >>> pts = {"all_reduce": [(n, 2e-4 + 7e-10 * n) for n in (4e3, 4e6, 16e6)]}
        >>> prof = calibrated_profile(load_cluster("cpu-local"), 2, pts, "gloo")
        >>> prof["fits"][0]["collective"], round(prof["intra_node"]["latency_s"], 6)
        ('all_reduce', 0.0001)
    """
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    data = cluster_to_dict(base)
    data["name"] = name or f"{base.name}-calibrated"
    data["backend"] = backend
    fits = []
    for coll, pts in sorted(measurements.items()):
        ns, ts = [p[0] for p in pts], [p[1] for p in pts]
        segments = fit_segments(ns, ts)
        worst = max(abs(e) for e in segment_errors(segments, ns, ts))
        for seg in segments:
            fits.append(
                {
                    "collective": coll,
                    "nproc": nproc,
                    "level": "gpu",
                    "alpha_s": seg.alpha_s,
                    "beta_s_per_byte": seg.beta_s_per_byte,
                    "min_bytes": seg.min_bytes,
                    "source": f"tensoropt calibrate --nproc {nproc} ({backend}, {stamp}); {statistic} times; "
                    f"{len(pts)} sizes {int(min(ns))}..{int(max(ns))} B; worst fit error {worst:.1%}",
                }
            )
    data["fits"] = fits
    ar = [f for f in fits if f["collective"] == "all_reduce"]
    if ar and nproc > 1:
        steps, factor = ring_coefficients("all_reduce", nproc)
        small, large = ar[0], ar[-1]  # latency from the small-message regime, bandwidth from the large one
        if small["alpha_s"] > 0:
            data["intra_node"]["latency_s"] = small["alpha_s"] / steps
        if large["beta_s_per_byte"] > 0:
            data["intra_node"]["bandwidth_gbps"] = factor / large["beta_s_per_byte"] / 1e9
        why = f"derived from the all_reduce fit of tensoropt calibrate --nproc {nproc} ({backend}, {stamp})"
        data["sources"]["intra_node.latency_s"] = why + ": alpha / 2(p-1)"
        data["sources"]["intra_node.bandwidth_gbps"] = why + ": 2(p-1)/p / beta"
        if base.num_nodes == 1:
            data["inter_node"] = dict(data["intra_node"])
            data["sources"]["inter_node.latency_s"] = "single node: same as intra_node"
            data["sources"]["inter_node.bandwidth_gbps"] = "single node: same as intra_node"
    return data
