"""The exact plan.json text of every plan of a frontier file, fast enough for thousands of plans.

:func:`tensoropt.plans.plan_file_text` renders one plan with ``json.dumps(indent=...)``, whose
pure-Python encoder makes ~35 KB per VGG-16 plan cost ~7 ms; a page with 1,700 plans would
spend 12 s there. Most of each file is shared between plans: the job, and the configuration
JSON of each (node, label) pair. So each plan is rendered by the real ``plan_file_text`` on a
copy of the frontier file whose shared parts are short sentinel strings, and every sentinel is
then replaced by its part rendered once with the same indentation. Sample plans are checked
against the plain ``plan_file_text``; any difference (a changed file format) falls back to it.

Example:
    >>> from tensoropt.plans import plan_file_text
    >>> fj = {"version": 1, "job": {"x": 1}, "frontiers": [{"devices": 1, "mesh": [], "plans": [
    ...     {"id": "d1-p0", "time_s": 1.0, "memory_bytes": 8, "ops": {}}], "configurations": {}}]}
    >>> all_plan_texts(fj)["d1-p0"] == plan_file_text(fj, "d1-p0")
    True
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

_SENTINEL_RE = re.compile(r'"\\u0000(\d+)\\u0000"')
SAMPLES_PER_FRONTIER = 3
"""Plans per frontier checked against the plain renderer (first, middle, last)."""


def all_plan_texts(
    frontier_json: dict, plan_text: Callable[[dict, str], str] | None = None, ids: list[str] | None = None
) -> dict[str, str]:
    """Plan id -> the text ``tensoropt select`` would write to plan.json for it.

    Args:
        frontier_json: parsed frontier.json.
        plan_text: ``(frontier_json, plan_id) -> text``; None is the planner's
            :func:`tensoropt.plans.plan_file_text` (the only renderer the fast path applies to).
        ids: the plans wanted (None: all).

    Returns:
        One text per plan, in file order (or the order of ``ids``).

    Example:
        >>> sorted(all_plan_texts({"job": {}, "frontiers": []}))
        []
    """
    from tensoropt.plans import plan_file_text

    if ids is None:
        ids = [str(p["id"]) for f in frontier_json.get("frontiers", []) for p in f.get("plans", [])]
    if plan_text is not None and plan_text is not plan_file_text:
        return {i: plan_text(frontier_json, i) for i in ids}
    texts = _composed_texts(frontier_json, ids, plan_file_text)
    if texts is None or not _agree(texts, frontier_json, plan_file_text):
        return {i: plan_file_text(frontier_json, i) for i in ids}
    return texts


def _composed_texts(frontier_json: dict, ids: list[str], render) -> dict[str, str] | None:
    """Render with sentinels for the shared parts, then splice the parts in (None: not applicable)."""
    parts: list = []

    def sentinel(value) -> str:
        parts.append(value)
        return f"\x00{len(parts) - 1}\x00"

    reduced = dict(frontier_json)
    reduced["job"] = sentinel(frontier_json.get("job", {}))
    # each plan is rendered from a file holding only its own frontier and itself (no search)
    single: dict[str, dict] = {}
    for frontier in frontier_json.get("frontiers", []):
        copy = dict(frontier)
        copy["configurations"] = {
            node: {label: sentinel(config) for label, config in labels.items()}
            for node, labels in frontier.get("configurations", {}).items()
        }
        for plan in frontier.get("plans", []):
            single[str(plan["id"])] = {**reduced, "frontiers": [{**copy, "plans": [plan]}]}
    if len(single) != sum(len(f.get("plans", [])) for f in frontier_json.get("frontiers", [])):
        return None  # repeated ids: leave it to the plain renderer
    first = render(single[ids[0]], ids[0]) if ids else ""
    indent = _indent_unit(first)
    if indent is None:
        return None
    rendered: dict[tuple[int, str], str] = {}

    def splice(match: re.Match, text: str) -> str:
        start = text.rfind("\n", 0, match.start()) + 1
        lead = text[start:match.start()]
        lead = lead[: len(lead) - len(lead.lstrip(" "))]
        key = (int(match.group(1)), lead)
        if key not in rendered:
            body = json.dumps(parts[key[0]], indent=indent)
            rendered[key] = body.replace("\n", "\n" + lead)
        return rendered[key]

    out = {}
    for plan_id in ids:
        text = render(single[plan_id], plan_id)
        out[plan_id] = _SENTINEL_RE.sub(lambda m, t=text: splice(m, t), text)
    return out


def _indent_unit(text: str) -> int | None:
    """Spaces per level of a ``json.dumps(dict, indent=n)`` text (None: not indented that way)."""
    lines = text.split("\n", 2)
    if len(lines) < 2 or not lines[0].startswith("{"):
        return None
    n = len(lines[1]) - len(lines[1].lstrip(" "))
    return n or None


def _agree(texts: dict[str, str], frontier_json: dict, render) -> bool:
    """True if sampled plans render identically with the plain renderer."""
    for frontier in frontier_json.get("frontiers", []):
        plans = [str(p["id"]) for p in frontier.get("plans", []) if str(p["id"]) in texts]
        picks = {0, len(plans) // 2, len(plans) - 1} if plans else set()
        for k in sorted(picks)[:SAMPLES_PER_FRONTIER]:
            if texts[plans[k]] != render(frontier_json, plans[k]):
                return False
    return True
