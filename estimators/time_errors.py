"""The estimator's measured step-time error per model family: the margin selection keeps (torch-free).

Two plans whose predicted step times differ by less than the cost model's error cannot be told
apart by it: picking the faster one picks on noise. :mod:`tensoropt.selector` therefore keeps the
simpler plan (data parallelism first, then fewer redistributions) unless the faster plan's
predicted gain over it exceeds the error measured for the model's family on the job's cluster.

The errors live in ``configs/time_errors.yaml`` (found like the profiles, :func:`configs_dirs`),
written by ``benchmarks/runtime.py --write-errors``: per cluster and family the estimator's error
on the predicted gain of a model-parallel plan over the data-parallel plan of the same model,
``|(measured / measured DP) / (predicted / predicted DP) - 1|``, both timed in one launch (the
load's and the profiled cache's common scale cancels), its last :data:`MAX_SAMPLES` samples, their
median, the models and when. A family or cluster the table lacks takes the table's
``default_error`` (the median of all its samples), and without any table :data:`DEFAULT_ERROR`.

Families are read off the captured graph's operators (:func:`model_family`): encoder and decoder
language models are one family here, their graphs differing only in the attention mask, which the
capture folds into a buffer.

Example:
    >>> model_family(["input", "aten.conv2d.default", "aten.batch_norm.default", "aten.linear.default"])
    'cnn'
    >>> table = TimeErrors(0.1, {"cpu-local": {"lm": FamilyError(0.08, 8, ("hf-bert",), "a run")}})
    >>> table.error("cpu-local", "lm").error, table.error("h100x8", "lm").error
    (0.08, 0.1)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from estimators.profile_files import ProfileError, _read_yaml, configs_dirs

TIME_ERRORS_FILE = "time_errors.yaml"
"""The table's file name under a configs directory."""

DEFAULT_ERROR = 0.10
"""The margin where no table is found: the median step-time error of ``benchmarks/runtime.py``'s
plans in docs/results.md's runs (5-11 %), rounded up."""


MAX_SAMPLES = 12
"""Samples a family keeps (the most recent): its error is their median."""

FAMILIES = ("cnn", "lm", "transformer", "mlp")
"""Model families, in the order :func:`model_family` tests them."""


def model_family(ops: Iterable[str]) -> str:
    """The family of a model from its graph's operator names (``aten.<op>.<overload>``).

    ``cnn``: a convolution; ``lm``: attention and an embedding (language models, encoder or
    decoder); ``transformer``: attention without an embedding; ``mlp``: anything else.

    Example:
        >>> model_family(["aten.embedding.default", "aten.scaled_dot_product_attention.default"])
        'lm'
        >>> model_family(["aten.linear.default", "aten.relu.default"])
        'mlp'
    """
    packets = {str(op).split(".")[1] for op in ops if str(op).startswith("aten.") and str(op).count(".") >= 2}
    if any(p.startswith(("conv", "convolution", "cudnn_convolution", "mkldnn_convolution")) for p in packets):
        return "cnn"
    softmax = {"softmax", "_softmax"} & packets
    softmax_attention = bool(softmax and {"bmm", "matmul", "baddbmm", "einsum"} & packets)
    if softmax_attention or any("attention" in p for p in packets):
        return "lm" if "embedding" in packets else "transformer"
    return "mlp"


@dataclass(frozen=True)
class FamilyError:
    """The measured step-time error of one family on one cluster."""

    error: float
    """The median of :attr:`samples` (a fraction)."""
    plans: int = 0
    """Samples (plans measured against their data-parallel plan)."""
    models: tuple[str, ...] = ()
    """The models they belong to."""
    source: str = ""
    """Which launches measured its samples (command, when, at what load; ``; ``-joined, newest last)."""
    samples: tuple[float, ...] = ()
    """The errors measured, most recent last."""


@dataclass(frozen=True)
class TimeErrors:
    """The table: per cluster and family a :class:`FamilyError`, and the default for the rest."""

    default_error: float = DEFAULT_ERROR
    """The margin of a cluster or family the table lacks."""
    clusters: dict[str, dict[str, FamilyError]] = field(default_factory=dict)
    """Cluster name -> family -> its error."""
    path: str = ""
    """The file it was read from ("" for the built-in default)."""

    def error(self, cluster: str, family: str) -> FamilyError:
        """The error of ``family`` on ``cluster``, or the default (its ``source`` says so).

        Example:
            >>> TimeErrors().error("cpu-local", "cnn").source
            'built-in default (no configs/time_errors.yaml)'
        """
        found = self.clusters.get(cluster, {}).get(family)
        if found is not None:
            return found
        where = (f"{self.path}'s default_error" if self.path
                 else f"built-in default (no configs/{TIME_ERRORS_FILE})")
        return FamilyError(self.default_error, 0, (), where)

    def to_dict(self) -> dict:
        """The YAML mapping (:func:`load_time_errors` reads it back).

        Example:
            >>> table = TimeErrors(0.1, {"c": {"lm": FamilyError(0.05, 2, ("m",), "s")}})
            >>> table.to_dict()["clusters"]["c"]["lm"]
            {'error': 0.05, 'plans': 2, 'models': ['m'], 'source': 's'}
        """
        def entry(e: FamilyError) -> dict:
            out = {"error": e.error, "plans": e.plans, "models": list(e.models), "source": e.source}
            return {**out, "samples": list(e.samples)} if e.samples else out

        return {"default_error": self.default_error,
                "clusters": {c: {f: entry(e) for f, e in fams.items()} for c, fams in self.clusters.items()}}


def time_errors_from_dict(data: dict, where: str = "<time errors>") -> TimeErrors:
    """Validate and build a :class:`TimeErrors` from its mapping (errors name the file and key).

    Example:
        >>> table = time_errors_from_dict({"default_error": 0.1, "clusters": {"c": {"lm": {"error": 0.2}}}})
        >>> table.error("c", "lm").error
        0.2
        >>> time_errors_from_dict({"default_error": -1})
        Traceback (most recent call last):
        ...
        estimators.profile_files.ProfileError: <time errors>: default_error must be a fraction >= 0, got -1
    """
    def fraction(value, key: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ProfileError(f"{where}: {key} must be a fraction >= 0, got {value!r}")
        return float(value)

    default = fraction(data.get("default_error", DEFAULT_ERROR), "default_error")
    clusters: dict[str, dict[str, FamilyError]] = {}
    for cluster, families in (data.get("clusters") or {}).items():
        if not isinstance(families, dict):
            raise ProfileError(f"{where}: clusters.{cluster} must map families to errors")
        for family, entry in families.items():
            key = f"clusters.{cluster}.{family}"
            if family not in FAMILIES:
                raise ProfileError(f"{where}: {key}: unknown family; expected one of {', '.join(FAMILIES)}")
            if not isinstance(entry, dict) or "error" not in entry:
                raise ProfileError(f"{where}: {key} must be a mapping with 'error'")
            samples = tuple(fraction(x, f"{key}.samples") for x in entry.get("samples", ()))
            clusters.setdefault(str(cluster), {})[family] = FamilyError(
                fraction(entry["error"], f"{key}.error"), int(entry.get("plans", 0)),
                tuple(str(m) for m in entry.get("models", ())), str(entry.get("source", "")), samples)
    return TimeErrors(default, clusters, where)


def time_errors_path() -> Path | None:
    """The first ``configs/time_errors.yaml`` of :func:`configs_dirs`, or None.

    Example:
        >>> time_errors_path() is None or time_errors_path().name == "time_errors.yaml"
        True
    """
    return next((d / TIME_ERRORS_FILE for d in configs_dirs() if (d / TIME_ERRORS_FILE).is_file()), None)


def load_time_errors(path: str | Path | None = None) -> TimeErrors:
    """The table at ``path`` (default: :func:`time_errors_path`); the built-in default when none exists.

    Example:
        >>> load_time_errors().default_error > 0
        True
    """
    path = Path(path) if path is not None else time_errors_path()
    if path is None:
        return TimeErrors()
    return time_errors_from_dict(_read_yaml(path), str(path))
