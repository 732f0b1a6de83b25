"""The self-contained Pareto HTML page: plotly.js inlined (compressed), figure, plans, page script.

The page makes no network request: plotly.js, the figure, the page script and the per-plan data
(the exact plan.json text of each plan, within the limit of :mod:`tensoropt.plot.details`, whose
``layers`` are the detail panel's rows) are all inside the file. The plan texts are stored as
pieces the plans share (:func:`tensoropt.plot.details.page_payload`), gzip-compressed and
base64-encoded; the page decompresses them with the browser's DecompressionStream.
"""

from __future__ import annotations

import base64
import functools
import gzip
import html
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

from plotly.offline import get_plotlyjs

from tensoropt.plans import write_text_atomic
from tensoropt.plot.data import PlotPoint, global_batch_size, job_budget_bytes, memory_unit, page_points
from tensoropt.plot.details import EMBED_LIMIT_BYTES, embedded_ids, page_payload
from tensoropt.plot.figure import pareto_figure
from tensoropt.sizes import format_size

ASSETS = Path(__file__).with_name("assets")
GZIP_LEVEL = 6
"""Compression of the embedded plans (their shared pieces: Llama-3-8B's 200 plans, 7.8 MB of JSON,
0.2 s to 244 KB; level 3: 0.09 s to 372 KB)."""
PLOTLY_GZIP_LEVEL = 6
"""Compression of the embedded plotly.js (once per process: 0.4 s)."""
LOG_RATIO = 8.0
"""A log axis is the default when the axis spans more than this factor."""
_META_OPEN = '<script type="application/json" id="tensoropt-meta">'
_PLACEHOLDER_RE = re.compile(r"__[A-Z0-9_]+__")


@functools.lru_cache(maxsize=1)
def _plotly_js() -> str:
    """plotly.min.js as shipped with the plotly package (read once)."""
    return get_plotlyjs()


@functools.lru_cache(maxsize=1)
def plotly_b64() -> str:
    """plotly.min.js gzip-compressed and base64-encoded, as the page embeds it (4.6 MiB -> 1.9 MiB;
    the page's script unpacks and runs it).

    Example:
        >>> gzip.decompress(base64.b64decode(plotly_b64())).decode() == _plotly_js()
        True
    """
    return base64.b64encode(gzip.compress(_plotly_js().encode("utf-8"), PLOTLY_GZIP_LEVEL)).decode("ascii")


def pareto_html(
    frontier_json: dict,
    budget_bytes: int | None = None,
    job_file: str | None = None,
    plan_text: Callable[[dict, str], str] | None = None,
    embed_limit_bytes: float = EMBED_LIMIT_BYTES,
) -> str:
    """The page's HTML text for a frontier.json dict.

    Args:
        frontier_json: parsed frontier.json (issue 5 schema with per-plan summary and layers).
        budget_bytes: per-device memory budget; None takes ``job.memory_budget`` if present.
        job_file: path of the job YAML shown in the ``tensoropt run`` command; None takes
            ``job_file`` from frontier.json, else the placeholder ``JOB.yaml``.
        plan_text: ``(frontier_json, plan_id) -> plan.json text``; None uses
            :func:`tensoropt.plans.plan_file_text` (what ``tensoropt select`` writes).
        embed_limit_bytes: limit on the plan.json text embedded for the panel and the download;
            above it only a thinned subset of plans carries details (see
            :mod:`tensoropt.plot.details`).

    Returns:
        A complete HTML document (1.9 MiB for the compressed plotly.js, plus the compressed plans).

    Example:
        >>> fj = {"job": {}, "frontiers": [{"devices": 1, "mesh": [], "plans": [
        ...     {"id": "d1-p0", "time_s": 1.0, "memory_bytes": 2**30, "ops": {}}]}]}
        >>> "<!DOCTYPE html>" in pareto_html(fj, plan_text=lambda fj, pid: "{}")
        True
    """
    return _render(frontier_json, budget_bytes, job_file, plan_text, embed_limit_bytes)


def write_pareto_html(frontier_json: dict, path: str | os.PathLike, budget_bytes: int | None = None,
                      job_file: str | None = None, embed_limit_bytes: float = EMBED_LIMIT_BYTES) -> Path:
    """Write the self-contained Pareto page to ``path`` (atomically; parents are created).

    Args:
        frontier_json: parsed frontier.json.
        path: output file, e.g. ``out/pareto.html``.
        budget_bytes: per-device memory budget drawn on the plot; None takes the job's.
        job_file: the job YAML named in the page's ``tensoropt run`` command (default ``JOB.yaml``).
        embed_limit_bytes: see :func:`pareto_html`.

    Returns:
        The written path.

    Example:
        >>> import json, tempfile
        >>> # not run here: needs a frontier.json from `tensoropt plan`
        >>> fj = json.load(open("out/vgg16/frontier.json"))  # doctest: +SKIP
        >>> write_pareto_html(fj, tempfile.mkdtemp() + "/pareto.html")  # doctest: +SKIP
    """
    path = Path(path)
    write_text_atomic(path, pareto_html(frontier_json, budget_bytes, job_file, None, embed_limit_bytes))
    return path


def with_meta(page: str, **changes) -> str:
    """The page with keys of its small meta block changed (e.g. ``selected``; ``server=True``
    for pages served by ``tensoropt ui``), without rendering it again.

    Example:
        >>> page = '<script type="application/json" id="tensoropt-meta">{"selected": "a"}</script>'
        >>> with_meta(page, selected="b")
        '<script type="application/json" id="tensoropt-meta">{"selected": "b"}</script>'
    """
    start = page.index(_META_OPEN) + len(_META_OPEN)
    end = page.index("</script>", start)
    meta = json.loads(page[start:end])
    meta.update(changes)
    return page[:start] + _script_json(json.dumps(meta)) + page[end:]


def _render(frontier_json, budget_bytes, job_file, plan_text, embed_limit_bytes) -> str:
    """Fill the page template."""
    if budget_bytes is None:
        budget_bytes = job_budget_bytes(frontier_json)
    selected = frontier_json.get("selected")
    points = page_points(frontier_json, budget_bytes)
    if not points:
        raise ValueError("frontier.json has no plans to plot (every frontier's 'plans' is empty)")
    unit = memory_unit(points)
    figure = pareto_figure(points, budget_bytes, selected, unit)
    job_file = job_file or frontier_json.get("job_file") or "JOB.yaml"
    every = [p.plan_id for p in points]
    data = page_payload(frontier_json, points, every, plan_text, job_file)
    size = sum(len(piece) for piece in data["pieces"])
    ids = embedded_ids(frontier_json, selected, embed_limit_bytes, plan_text, total_bytes=size)
    if len(ids) < len(every):  # over the limit: an even subset of the plans carries its details
        data = page_payload(frontier_json, points, ids, plan_text, job_file)
    meta = {
        "plans": len(points),
        "embedded": len(ids),
        "selected": selected,
        "memory_unit": unit[0],
        "unit_bytes": unit[1],
        "budget_x": None if budget_bytes is None else budget_bytes / unit[1],
        "batch": global_batch_size(frontier_json),
    }
    packed = gzip.compress(json.dumps(data).encode("utf-8"), GZIP_LEVEL)
    title = f"tensoropt · Pareto frontier · {_model_name(frontier_json)}"
    fills = {
        "__TITLE__": html.escape(title),
        "__JOB_LINE__": html.escape(_job_line(frontier_json, points, budget_bytes)),
        "__THROUGHPUT_DISABLED__": "" if meta["batch"] else "disabled",
        "__LOGX__": "checked" if _spans(p.memory_bytes for p in points) else "",
        "__LOGY__": "checked" if _spans(p.time_s for p in points) else "",
        "__CSS__": (ASSETS / "pareto.css").read_text(encoding="utf-8"),
        "__FIGURE_JSON__": _script_json(json.dumps(figure)),
        "__META_JSON__": _script_json(json.dumps(meta)),
        "__DATA_B64__": base64.b64encode(packed).decode("ascii"),
        "__PAGE_JS__": (ASSETS / "pareto.js").read_text(encoding="utf-8"),
        "__PLOTLY_B64__": plotly_b64(),
    }
    # one pass over the template: inserted text (plan summaries, plotly.js) is never rescanned
    template = (ASSETS / "page.html").read_text(encoding="utf-8")
    return _PLACEHOLDER_RE.sub(lambda m: fills[m.group(0)], template)


def _script_json(text: str) -> str:
    """JSON safe inside a <script> element (no "</" that could close it)."""
    return text.replace("</", "<\\/").replace("<!--", "<\\u0021--")


def _model_name(frontier_json: dict) -> str:
    model = frontier_json.get("job", {}).get("model", {})
    return str(model.get("name") or model.get("factory") or "model")


def _job_line(frontier_json: dict, points: list[PlotPoint], budget_bytes: int | None) -> str:
    """One line under the title: batch, optimizer, dtype, cluster, device counts, budget."""
    job = frontier_json.get("job", {})
    training = job.get("training", {})
    cluster = job.get("cluster")
    if isinstance(cluster, dict):
        cluster = cluster.get("name", "inline cluster")
    elif isinstance(cluster, str) and cluster.endswith((".yaml", ".yml")):
        cluster = Path(cluster).stem  # a profile path: its name is enough here
    parts = []
    if training.get("global_batch_size"):
        parts.append(f"global batch {training['global_batch_size']}")
    parts += [str(training[k]) for k in ("optimizer", "dtype") if training.get(k)]
    if cluster:
        parts.append(f"cluster {cluster}")
    counts = sorted({p.devices for p in points})
    parts.append(f"{len(points)} plans on {', '.join(map(str, counts))} devices")
    if budget_bytes is not None:
        parts.append(f"memory budget {format_size(budget_bytes)} per device")
    return " · ".join(parts)


def _spans(values) -> bool:
    """True if the positive values span more than :data:`LOG_RATIO`."""
    values = [v for v in values if v > 0]
    return bool(values) and max(values) / min(values) > LOG_RATIO
