"""Per-plan details of the page: the panel's rows and the exact plan.json text, and which plans
carry them inside the file.

Every plan is drawn and hoverable. Its details (per-layer rows and plan.json text, ~35 KB per
VGG-16 plan, ~110 KB per GPT-2 plan) go into the file for all plans while their plan files total
at most ``embed_limit_bytes``; beyond that, for an evenly thinned subset of each frontier (the
fastest, the smallest and the selected plan always among them), so a frontier of thousands of
plans still makes a page of bounded size and build time. ``tensoropt ui`` serves the details of
the other plans on request (:func:`plan_details`).

Example:
    >>> from tensoropt.plans import plan_file_text
    >>> fj = {"version": 1, "job": {}, "frontiers": [{"devices": 1, "mesh": [], "plans": [
    ...     {"id": "d1-p0", "time_s": 1.0, "memory_bytes": 8, "ops": {}}], "configurations": {}}]}
    >>> embedded_ids(fj, None, 10**6)
    ['d1-p0']
"""

from __future__ import annotations

import math
from collections.abc import Callable

from tensoropt.plot.data import PlotPoint, page_points
from tensoropt.plot.plan_texts import all_plan_texts, plan_text_pieces

EMBED_LIMIT_BYTES = 80 * 2**20
"""Default limit on the plan.json text embedded in one page: the distinct pieces of the plans'
texts (:func:`page_payload`; ~6 MiB once compressed; Llama-3-8B's 200 plans on 4 counts: 5 MiB)."""


def embedded_ids(
    frontier_json: dict,
    selected: str | None,
    limit_bytes: float,
    plan_text: Callable[[dict, str], str] | None = None,
    total_bytes: float | None = None,
) -> list[str]:
    """Ids of the plans whose details the page embeds.

    Args:
        frontier_json: parsed frontier.json.
        selected: the selected plan's id (always embedded), or None.
        limit_bytes: limit on the total plan.json text; each frontier's plan size is estimated
            from its first plan.
        plan_text: the plan.json renderer (None: :func:`tensoropt.plans.plan_file_text`).
        total_bytes: the size of every plan's details as embedded (the page passes its pieces'
            total, :func:`page_payload`); None estimates the plan files' total text.

    Returns:
        Ids in file order: all plans when they fit, else every k-th plan of each frontier plus
        its first (fastest) and last (smallest) plan and ``selected``, with k chosen to fit.

    Example:
        >>> fj = {"job": {}, "frontiers": [{"devices": 2, "mesh": [2], "plans": [
        ...     {"id": f"d2-p{i}", "time_s": 1.0 + i, "memory_bytes": 9 - i, "ops": {}} for i in range(9)]}]}
        >>> embedded_ids(fj, "d2-p5", 4 * 16, plan_text=lambda fj, pid: "x" * 16)
        ['d2-p0', 'd2-p3', 'd2-p5', 'd2-p6', 'd2-p8']
    """
    render = plan_text or _plan_file_text
    frontiers = [f.get("plans", []) for f in frontier_json.get("frontiers", [])]
    total = total_bytes if total_bytes is not None else sum(
        len(plans) * len(render(frontier_json, str(plans[0]["id"]))) for plans in frontiers if plans)
    stride = 1 if total <= limit_bytes else math.ceil(total / max(limit_bytes, 1.0))
    ids = []
    for plans in frontiers:
        for i, plan in enumerate(plans):
            plan_id = str(plan["id"])
            if i % stride == 0 or i == len(plans) - 1 or plan_id == selected:
                ids.append(plan_id)
    return ids


def plan_payload(point: PlotPoint, mesh: str, command: str) -> dict:
    """What the detail panel shows for one plan (besides its plan.json text).

    Example:
        >>> plan_payload(PlotPoint("d1-p0", 1, 0.5, 8, None, "", True), "", "tensoropt run ...")["time_s"]
        0.5
    """
    return {
        "devices": point.devices, "mesh": mesh, "time_s": point.time_s, "memory_bytes": point.memory_bytes,
        "throughput": point.throughput, "summary": point.summary, "fits": point.fits, "layers": point.layers,
        "command": command,
    }


def run_command(job_file: str, plan_path: str, devices: int, nodes: int = 1) -> str:
    """The ``tensoropt run`` command line for a plan on ``devices`` devices over ``nodes`` machines.

    Example:
        >>> run_command("job.yaml", "plan.json", 8)
        'tensoropt run job.yaml --plan plan.json --nproc 8'
        >>> run_command("j.yaml", "p.json", 16, nodes=2).split("\\n")[1].split(" --plan p.json ")[1]
        '--nnodes 2 --nproc-per-node 8 --node-rank RANK --rdzv-endpoint HOST:PORT'
    """
    command = f"tensoropt run {job_file} --plan {plan_path}"
    if nodes <= 1:
        return f"{command} --nproc {devices}"
    return (f"# on each of the {nodes} machines (RANK 0..{nodes - 1}; HOST:PORT of machine 0)\n"
            f"{command} --nnodes {nodes} --nproc-per-node {devices // nodes} --node-rank RANK "
            "--rdzv-endpoint HOST:PORT")


def frontier_nodes(frontier: dict) -> int:
    """Machines a frontier's mesh spans: the product of its ``node``-level axes.

    Example:
        >>> frontier_nodes({"mesh": [2, 2, 2], "mesh_levels": ["node", "gpu", "gpu"]})
        2
    """
    nodes = 1
    for size, level in zip(frontier.get("mesh", []), frontier.get("mesh_levels", [])):
        nodes *= int(size) if level == "node" else 1
    return nodes


def details_payload(
    frontier_json: dict, points: list[PlotPoint], ids: list[str], plan_text: Callable | None = None,
    job_file: str = "JOB.yaml",
) -> dict:
    """``{"plans": {id: panel payload}, "texts": {id: plan.json text}}`` for the plans ``ids``.

    Example:
        >>> from tensoropt.plot.data import page_points
        >>> fj = {"version": 1, "job": {}, "frontiers": [{"devices": 1, "mesh": [], "plans": [
        ...     {"id": "d1-p0", "time_s": 1.0, "memory_bytes": 8, "ops": {}}], "configurations": {}}]}
        >>> sorted(details_payload(fj, page_points(fj, None), ["d1-p0"])["texts"])
        ['d1-p0']
    """
    return {
        "plans": _panels(frontier_json, points, ids, job_file),
        "texts": all_plan_texts(frontier_json, plan_text, ids),
    }


def page_payload(
    frontier_json: dict, points: list[PlotPoint], ids: list[str], plan_text: Callable | None = None,
    job_file: str = "JOB.yaml",
) -> dict:
    """The data the page embeds for the plans ``ids``: ``{"plans": {id: panel payload without its
    layers}, "pieces": [text, ...], "texts": {id: [first, count, ...]}}``. A plan's plan.json text
    is its runs of pieces put together (:func:`tensoropt.plot.plan_texts.joined_text`; plans
    share most pieces, so each is stored once), and the panel's layers are that text's
    ``layers``: the page's script makes both when a plan is shown.

    Example:
        >>> from tensoropt.plot.data import page_points
        >>> import json
        >>> from tensoropt.plot.plan_texts import joined_text
        >>> fj = {"version": 1, "job": {}, "frontiers": [{"devices": 1, "mesh": [], "plans": [
        ...     {"id": "d1-p0", "time_s": 1.0, "memory_bytes": 8, "ops": {}}], "configurations": {}}]}
        >>> data = page_payload(fj, page_points(fj, None), ["d1-p0"])
        >>> text = joined_text(data["pieces"], data["texts"]["d1-p0"])
        >>> json.loads(text)["id"], "layers" in data["plans"]["d1-p0"]
        ('d1-p0', False)
    """
    if plan_text is None:
        pieces, texts = plan_text_pieces(frontier_json, ids)
    else:
        pieces = [plan_text(frontier_json, i) for i in ids]
        texts = {i: [k, 1] for k, i in enumerate(ids)}
    plans = _panels(frontier_json, points, ids, job_file)
    for payload in plans.values():
        del payload["layers"]
    return {"plans": plans, "pieces": pieces, "texts": texts}


def _panels(frontier_json: dict, points: list[PlotPoint], ids: list[str], job_file: str) -> dict:
    """Plan id -> :func:`plan_payload` for the plans ``ids``."""
    frontiers = {int(f["devices"]): f for f in frontier_json.get("frontiers", [])}
    wanted = set(ids)
    plans = {}
    for p in points:
        if p.plan_id in wanted:
            frontier = frontiers[p.devices]
            command = run_command(job_file, "plan.json", p.devices, frontier_nodes(frontier))
            plans[p.plan_id] = plan_payload(p, mesh_text(frontier.get("mesh")), command)
    return plans


def plan_details(
    frontier_json: dict, plan_id: str, budget_bytes: int | None, job_file: str = "JOB.yaml"
) -> dict:
    """One plan's ``{"plan": panel payload, "text": plan.json text}`` (KeyError: no such plan).

    Example:
        >>> fj = {"version": 1, "job": {}, "frontiers": [{"devices": 1, "mesh": [], "plans": [
        ...     {"id": "d1-p0", "time_s": 1.0, "memory_bytes": 8, "ops": {}}], "configurations": {}}]}
        >>> plan_details(fj, "d1-p0", None)["plan"]["devices"]
        1
    """
    points = [p for p in page_points(frontier_json, budget_bytes) if p.plan_id == plan_id]
    if not points:
        raise KeyError(plan_id)
    payload = details_payload(frontier_json, points, [plan_id], job_file=job_file)
    return {"plan": payload["plans"][plan_id], "text": payload["texts"][plan_id]}


def mesh_text(mesh) -> str:
    """``[2, 4]`` or ``{"shape": [2, 4], ...}`` as ``"2 × 4"``.

    Example:
        >>> mesh_text([2, 4]), mesh_text({"shape": [8]})
        ('2 × 4', '8')
    """
    shape = mesh.get("shape", []) if isinstance(mesh, dict) else (mesh or [])
    return " × ".join(str(s) for s in shape)


def _plan_file_text(frontier_json: dict, plan_id: str) -> str:
    from tensoropt.plans import plan_file_text

    return plan_file_text(frontier_json, plan_id)
