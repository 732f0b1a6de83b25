"""Alpha-beta cost of collectives over mesh axes, flat or hierarchical (torch-free).

For a group of ``p`` devices on one level with per-step latency ``a`` and per-device bandwidth
``B`` (ring algorithms, shared/guide/COSTS.md; Thakur, Rabenseifner & Gropp 2005)::

    all_reduce(n)      2(p-1) a + 2(p-1)/p * n/B        n = tensor bytes
    reduce_scatter(n)   (p-1) a +  (p-1)/p * n/B        n = input (full) bytes
    all_gather(n)       (p-1) a +  (p-1)/p * n/B        n = output (full) bytes
    all_to_all(n)       (p-1) a +  (p-1)/p * n/B        n = bytes each device holds
    broadcast(n)   ceil(log2 p) a +          n/B        (pipelined)

A group over several mesh axes has ``p = prod(axis sizes)``. When it mixes inter-node
("node") and intra-node ("gpu") axes the collective is hierarchical: all-reduce = reduce-scatter
inside the node + all-reduce of ``n/p_intra`` across nodes + all-gather inside the node;
all-gather and reduce-scatter are the matching two-stage halves; all-to-all is bounded by the
slower link for the bytes that cross it. Calibrated fits (``Cluster.fits``) replace the
formula when collective, group size and level match. gloo has no all-to-all: it is an
all-gather of every device's buffer followed by a local chunk.

Gradient all-reduce (data parallelism) is bucketed, by the executor as by DDP: gradients join
a bucket in the order backward produces them; the step's first bucket is started once it holds
``FIRST_GRAD_BUCKET_BYTES``, later ones at ``GRAD_BUCKET_BYTES``, the rest after backward; each
bucket is one all-reduce. Priced per parameter (additive, :func:`grad_all_reduce_time_s`): a
gradient of ``b >= GRAD_BUCKET_BYTES`` closes a bucket nearly alone and pays its own all-reduce
``T(b)``; a smaller one pays its marginal price, what ``b`` more bytes add to the buckets, a full
bucket's time per byte ``T(GRAD_BUCKET_BYTES) * b / GRAD_BUCKET_BYTES``. The rest of what the
model's smaller gradients (``Q`` bytes) cost in ``k = grad_bucket_count(Q)`` buckets of mean size
``s = Q / k`` -- ``k * T(s)`` less their marginal prices: the first bucket's and the last partial
one's latency, :func:`grad_bucket_fixed_s` -- is paid whatever the plan and charged to every
configuration alike (by parameter bytes, :func:`estimators.op_costs.node_cost`), so a data-parallel
plan totals the executor's ``k`` all-reduces and dropping a gradient (replicating an embedding)
saves its bytes and its share of the 25 MiB buckets' latency, not a whole latency. The rule before
(every gradient of 1 MiB or more its own all-reduce) charged a latency per medium gradient, and
the planner replicated embeddings (gpt, GPT-2, BERT) to save latencies the runtime never paid.
Sync points (issue 29): a collective whose result the next operator needs at once (a
redistribution between operators, forward or backward; a synchronised batch norm's statistics; a
class-split loss's all-reduces) stops every rank there: the first to arrive waits for the other and
wakes late. The fits above time collectives issued back to back, which holds no such wait, so
:meth:`CommModel.blocking_time_s` adds the device's ``sync_point_s`` (``configs/devices/*.yaml``,
measured by ``benchmarks/sync_points.py``) to each such collective. The gradient buckets are not
sync points (started during backward, waited once at the step's end by every plan alike).
``sync_point_s`` is a dedicated host's: the wait for the last rank to issue the collective, less
what that rank waited for a core beyond the others. From the last rank's issue to the wait's end a
collective in a replayed step takes what ``tensoropt calibrate`` measures at the same load
(``benchmarks/fidelity.py --comm-clock``), so a loaded host's slowing of the collective itself is
the load's, not a sync point's.

Without the model's total (``bucketed_bytes`` None) a gradient below ``FIRST_GRAD_BUCKET_BYTES``
pays its share of a first-size bucket and a larger one ``T(b)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from estimators.configuration import Mesh
from estimators.profiles import COLLECTIVES, Cluster, Link

GRAD_BUCKET_BYTES = 25 * 2**20
"""Largest flattened gradient bucket (DDP's default bucket size; the executor's too)."""

FIRST_GRAD_BUCKET_BYTES = 2**20
"""The first bucket of a step is started at this size (DDP's default), so communication starts early."""


class CommModel:
    """Collective times on one mesh of one cluster.

    Example:
        >>> from estimators.profiles import load_cluster
        >>> cm = CommModel(load_cluster("h100-4x8-ib"), Mesh.for_cluster(16, 8))
        >>> cm.time_s("all_reduce", 1e8, (0,)) > cm.time_s("all_reduce", 1e8, (1,))  # node axis is slower
        True
    """

    def __init__(self, cluster: Cluster, mesh: Mesh):
        self.cluster = cluster
        self.mesh = mesh
        self.memo: dict = {}
        """Redistribution times already computed on this mesh (see estimators.redistribution)."""

    def group(self, axes: Iterable[int]) -> tuple[int, int]:
        """(inter-node size, intra-node size) of the group spanned by ``axes``.

        Example:
            >>> from estimators.profiles import load_cluster
            >>> CommModel(load_cluster("h100-4x8-ib"), Mesh.for_cluster(16, 8)).group((0, 1, 2))
            (2, 4)
        """
        inter = intra = 1
        for a in axes:
            if not 0 <= a < len(self.mesh.shape):
                raise ValueError(f"mesh axis {a} out of range for mesh {self.mesh.shape}")
            if self.mesh.levels[a] == "node":
                inter *= self.mesh.shape[a]
            else:
                intra *= self.mesh.shape[a]
        return inter, intra

    def time_s(self, collective: str, nbytes: float, axes: Iterable[int]) -> float:
        """Seconds for one ``collective`` on ``nbytes`` (see the module table for n) over ``axes``.

        Example:
            >>> from estimators.profiles import load_cluster
            >>> cm = CommModel(load_cluster("h100x8"), Mesh.for_cluster(8, 8))
            >>> cm.time_s("all_gather", 0, ()) == 0.0 and cm.time_s("all_gather", 1e6, (0, 1, 2)) > 0
            True
        """
        if collective not in COLLECTIVES:
            raise ValueError(f"unknown collective {collective!r}; expected one of {COLLECTIVES}")
        inter, intra = self.group(axes)
        if inter * intra == 1 or nbytes <= 0:
            return 0.0
        if collective == "all_to_all" and not self.cluster.has_all_to_all:
            return self.time_s("all_gather", nbytes * inter * intra, axes)
        if inter == 1:
            return self._level(collective, nbytes, intra, "gpu")
        if intra == 1:
            return self._level(collective, nbytes, inter, "node")
        return self._hierarchical(collective, nbytes, inter, intra)

    def blocking_time_s(self, collective: str, nbytes: float, axes: Iterable[int]) -> float:
        """Seconds of one collective the next operator waits for: :meth:`time_s` plus the device's
        ``sync_point_s`` (the wait at the sync point; see the module docstring); 0 where no data moves.

        Example:
            >>> from estimators.profiles import Device, load_cluster
            >>> import dataclasses
            >>> cl = load_cluster("cpu-local")
            >>> cl = dataclasses.replace(cl, device=dataclasses.replace(cl.device, sync_point_s=1e-3))
            >>> cm = CommModel(cl, Mesh((2,), ("gpu",)))
            >>> extra_s = cm.blocking_time_s("all_reduce", 4096, (0,)) - cm.time_s("all_reduce", 4096, (0,))
            >>> round(extra_s * 1e3, 9)
            1.0
            >>> cm.blocking_time_s("all_reduce", 0, (0,))
            0.0
        """
        t = self.time_s(collective, nbytes, axes)
        return t + self.cluster.device.sync_point_s if t > 0 else t

    def _level(self, collective: str, nbytes: float, p: int, level: str) -> float:
        """One collective on ``p`` devices of one level: the calibrated fit if any, else the formula."""
        fitted = self._fitted(collective, p, level, nbytes)
        if fitted is not None:
            return fitted
        return flat_time_s(collective, nbytes, p, self.cluster.link(level))

    def _fitted(self, collective: str, p: int, level: str, nbytes: float) -> float | None:
        """Calibrated time: the fit for ``p`` processes, else the nearest group size's fit scaled by the
        ring formula's latency steps and bandwidth factor (both grow with p, so cost stays monotone)."""
        fits = [f for f in self.cluster.fits if f.collective == collective and f.level == level]
        if not fits:
            return None
        q = min({f.nproc for f in fits}, key=lambda n: (abs(n - p), -n))
        if q == p:
            return self.cluster.fit_time_s(collective, p, level, nbytes)
        steps_q, factor_q = ring_coefficients(collective, q)
        steps_p, factor_p = ring_coefficients(collective, p)
        times = [
            f.alpha_s * steps_p / steps_q + f.beta_s_per_byte * nbytes * factor_p / factor_q
            for f in fits
            if f.nproc == q and f.min_bytes <= nbytes
        ]
        return max(times) if times else None

    def _hierarchical(self, collective: str, nbytes: float, inter: int, intra: int) -> float:
        """A collective whose group spans ``inter`` nodes x ``intra`` devices per node."""
        lv = self._level
        if collective == "all_reduce":
            return (
                lv("reduce_scatter", nbytes, intra, "gpu")
                + lv("all_reduce", nbytes / intra, inter, "node")
                + lv("all_gather", nbytes, intra, "gpu")
            )
        if collective == "reduce_scatter":
            return lv("reduce_scatter", nbytes, intra, "gpu") + lv(
                "reduce_scatter", nbytes / intra, inter, "node"
            )
        if collective == "all_gather":
            return lv("all_gather", nbytes / intra, inter, "node") + lv("all_gather", nbytes, intra, "gpu")
        fast, slow = self.cluster.intra_node, self.cluster.inter_node
        p = inter * intra
        if collective == "all_to_all":
            intra_bytes = (intra - 1) / p * nbytes
            inter_bytes = (p - intra) / p * nbytes
            return (p - 1) * max(fast.latency_s, slow.latency_s) + max(
                intra_bytes * fast.seconds_per_byte, inter_bytes * slow.seconds_per_byte
            )
        # broadcast: pipelined down a tree; the slow link bounds the bandwidth term.
        return math.ceil(math.log2(p)) * slow.latency_s + nbytes * slow.seconds_per_byte


def flat_time_s(collective: str, nbytes: float, p: int, link: Link) -> float:
    """Ring alpha-beta time of one collective on ``p`` devices joined by ``link``.

    Example:
        >>> flat_time_s("all_reduce", 1e9, 2, Link(bandwidth_gbps=1.0, latency_s=0.0))
        1.0
    """
    if p <= 1 or nbytes <= 0:
        return 0.0
    steps, factor = ring_coefficients(collective, p)
    return steps * link.latency_s + factor * nbytes * link.seconds_per_byte


def ring_coefficients(collective: str, p: int) -> tuple[float, float]:
    """(latency steps, bandwidth factor) of the ring formula: time = steps*a + factor*n/B.

    Used to turn a measured fit ``alpha + beta*n`` back into a per-step latency and a link
    bandwidth (``a = alpha/steps``, ``1/B = beta/factor``).

    Example:
        >>> ring_coefficients("all_reduce", 4)
        (6.0, 1.5)
    """
    if collective == "all_reduce":
        return 2.0 * (p - 1), 2.0 * (p - 1) / p
    if collective in ("reduce_scatter", "all_gather", "all_to_all"):
        return float(p - 1), (p - 1) / p
    if collective == "broadcast":
        return float(math.ceil(math.log2(p))), 1.0
    raise ValueError(f"unknown collective {collective!r}; expected one of {COLLECTIVES}")


def grad_bucket_count(bucketed_bytes: float) -> int:
    """Buckets the executor's rule fills with ``bucketed_bytes`` of gradients (each below a bucket).

    The first bucket is started at ``FIRST_GRAD_BUCKET_BYTES``, later ones at ``GRAD_BUCKET_BYTES``;
    what is left after backward is one more bucket.

    Example:
        >>> grad_bucket_count(0), grad_bucket_count(2**20), grad_bucket_count(48 * 2**20)
        (0, 1, 3)
    """
    if bucketed_bytes <= 0:
        return 0
    if bucketed_bytes <= FIRST_GRAD_BUCKET_BYTES:
        return 1
    return 1 + math.ceil((bucketed_bytes - FIRST_GRAD_BUCKET_BYTES) / GRAD_BUCKET_BYTES)


def grad_all_reduce_time_s(comm: CommModel, nbytes: float, axes: Iterable[int],
                           bucketed_bytes: float | None = None) -> float:
    """A parameter's share of the bucketed gradient all-reduce of ``nbytes`` over ``axes``.

    From ``GRAD_BUCKET_BYTES`` up, its own all-reduce. Below, with the model's ``bucketed_bytes``
    known, its marginal price ``T(GRAD_BUCKET_BYTES) * nbytes / GRAD_BUCKET_BYTES`` (the buckets'
    fixed rest is :func:`grad_bucket_fixed_s`). With ``bucketed_bytes`` None: its own all-reduce
    from ``FIRST_GRAD_BUCKET_BYTES`` up, below that its share of a first-size bucket.

    Example:
        >>> from estimators.profiles import load_cluster
        >>> cm = CommModel(load_cluster("cpu-local"), Mesh((2,), ("gpu",)))
        >>> bias = grad_all_reduce_time_s(cm, 4096, (0,))
        >>> bias < cm.time_s("all_reduce", 4096, (0,)) / 50  # no longer one latency per bias
        True
        >>> grad_all_reduce_time_s(cm, 2**22, (0,)) == cm.time_s("all_reduce", 2**22, (0,))
        True
        >>> shared = grad_all_reduce_time_s(cm, 2**22, (0,), bucketed_bytes=48 * 2**20)
        >>> shared < cm.time_s("all_reduce", 2**22, (0,))  # shares a 25 MiB bucket's latency
        True
    """
    if nbytes >= GRAD_BUCKET_BYTES or (bucketed_bytes is None and nbytes >= FIRST_GRAD_BUCKET_BYTES):
        return comm.time_s("all_reduce", nbytes, axes)
    if bucketed_bytes is None:
        return comm.time_s("all_reduce", FIRST_GRAD_BUCKET_BYTES, axes) * nbytes / FIRST_GRAD_BUCKET_BYTES
    return comm.time_s("all_reduce", GRAD_BUCKET_BYTES, axes) * nbytes / GRAD_BUCKET_BYTES


def grad_bucket_fixed_s(comm: CommModel, bucketed_bytes: float, axes: Iterable[int]) -> float:
    """What the model's ``bucketed_bytes`` of smaller gradients cost in their buckets beyond their
    marginal prices: ``k * T(Q / k) - T(GRAD_BUCKET_BYTES) * Q / GRAD_BUCKET_BYTES`` (>= 0).

    Example:
        >>> from estimators.profiles import load_cluster
        >>> cm = CommModel(load_cluster("cpu-local"), Mesh((2,), ("gpu",)))
        >>> q = 3 * 2**20
        >>> total = grad_bucket_fixed_s(cm, q, (0,)) + grad_all_reduce_time_s(cm, q, (0,), q)
        >>> abs(total - 2 * cm.time_s("all_reduce", q / 2, (0,))) < 1e-12  # two buckets
        True
    """
    k = grad_bucket_count(bucketed_bytes)
    if k == 0:
        return 0.0
    buckets_s = k * comm.time_s("all_reduce", bucketed_bytes / k, axes)
    marginal_s = comm.time_s("all_reduce", GRAD_BUCKET_BYTES, axes) * bucketed_bytes / GRAD_BUCKET_BYTES
    return max(0.0, buckets_s - marginal_s)
