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


def plan_text_pieces(frontier_json: dict, ids: list[str] | None = None
                     ) -> tuple[list[str], dict[str, list[int]]]:
    """The plan.json texts of plans ``ids`` as pieces shared between them, for the page to embed.

    Each plan's text is exactly :func:`tensoropt.plans.plan_file_text`'s, cut into its lines of the
    two top levels, each with what it opens (a layer row, a placement, an ``ops`` entry, whole):
    plans share most of them, so each distinct piece is kept once. ``texts[id]`` lists runs
    ``[first, count, first, count, ...]`` of piece indices (:func:`joined_text`). The pieces are
    made from :func:`tensoropt.plans.plan_file_json` by the rules of ``json.dumps(indent=...)``,
    each shared value rendered once; a plan per frontier is checked against the plain renderer,
    and on any difference each text is one piece of its own.

    Args:
        frontier_json: a frontier.json dict of either form (rows inline or shared).
        ids: the plans wanted (None: all), in the order of ``texts``.

    Example:
        >>> from tensoropt.plans import plan_file_text
        >>> fj = {"version": 1, "job": {"x": 1}, "frontiers": [{"devices": 1, "mesh": [], "plans": [
        ...     {"id": f"d1-p{i}", "time_s": 1.0 + i, "memory_bytes": 8, "ops": {"fc": "replicate"}}
        ...     for i in range(2)], "configurations": {"fc": {"replicate": {"label": "replicate"}}}}]}
        >>> pieces, texts = plan_text_pieces(fj)
        >>> joined_text(pieces, texts["d1-p1"]) == plan_file_text(fj, "d1-p1")
        True
    """
    from tensoropt.plans import (
        PLAN_FILE_INDENT,
        pack_frontier_json,
        plan_file_json,
        plan_file_text,
        unpack_frontier_json,
    )

    shared = unpack_frontier_json(pack_frontier_json(frontier_json))  # equal rows are one object
    if ids is None:
        ids = [str(p["id"]) for f in shared.get("frontiers", []) for p in f.get("plans", [])]
    lines = _TopLines(PLAN_FILE_INDENT)
    texts = {plan_id: _runs(lines.refs(plan_file_json(shared, plan_id))) for plan_id in ids}
    if ids and joined_text(lines.pieces, texts[ids[-1]]) != plan_file_text(frontier_json, ids[-1]):
        texts = all_plan_texts(frontier_json, None, ids)  # a changed file format: whole texts
        return [texts[i] for i in ids], {i: [k, 1] for k, i in enumerate(ids)}
    return lines.pieces, texts


def joined_text(pieces: list[str], runs: list[int]) -> str:
    """A text of :func:`plan_text_pieces` put together (what the page's script does).

    Example:
        >>> joined_text(["a", "b", "c"], [2, 1, 0, 2])
        'cab'
    """
    return "".join("".join(pieces[first:first + count]) for first, count in zip(runs[::2], runs[1::2]))


_ELEMENT = object()
"""The key of a list's element in :meth:`_TopLines.line`."""
_TOP = object()
"""The mark of a first-level line in :class:`_TopLines`'s memo."""


class _TopLines:
    """The lines of ``json.dumps(obj, indent=n) + "\\n"`` for dicts ``obj``, cut at their two top
    levels (a line of the second level carries its whole value), as indices into ``pieces``.
    Values are rendered once per object (rows, configurations, the job: shared between plans) and
    ``"key": value`` lines once per pair."""

    def __init__(self, indent: int) -> None:
        self.pad1, self.pad2 = " " * indent, " " * (2 * indent)
        self.indent = indent
        self.pieces: list[str] = []
        self.index: dict[str, int] = {}
        self.lines: dict[tuple, int] = {}  # memo of a pair -> its piece, with its comma
        self.last: dict[int, int] = {}  # piece with its comma -> the piece without
        self.keep: list = []  # the objects whose ids key ``lines``: alive, so no id is reused

    def intern(self, line: str) -> int:
        """The index of a piece (appended when new)."""
        i = self.index.get(line)
        if i is None:
            i = self.index[line] = len(self.pieces)
            self.pieces.append(line)
        return i

    def render(self, value, pad: str) -> str:
        """``value`` as json.dumps renders it at the depth of ``pad``."""
        if isinstance(value, (dict, list)):
            return json.dumps(value, indent=self.indent).replace("\n", "\n" + pad)
        return json.dumps(value)

    def line(self, key, value) -> int:
        """The second-level line of ``value`` (``key``: its key in a dict, :data:`_ELEMENT` in a
        list) with its comma, rendered once per pair."""
        nested = type(value) in (dict, list)
        memo = (key, id(value)) if nested else (key, value, type(value))
        hit = self.lines.get(memo)
        if hit is None:
            if nested:
                self.keep.append(value)
            head = self.pad2 if key is _ELEMENT else f"{self.pad2}{json.dumps(key)}: "
            hit = self.lines[memo] = self.intern(head + self.render(value, self.pad2) + ",\n")
        return hit

    def refs(self, obj: dict) -> list[int]:
        """The piece indices of the text of ``obj``."""
        out = [self.intern("{\n")]
        items = list(obj.items())
        for k, (key, value) in enumerate(items):
            end = ",\n" if k < len(items) - 1 else "\n"
            head = f"{self.pad1}{json.dumps(key)}: "
            if isinstance(value, (list, dict)) and value:
                opener, closer = ("[", "]") if isinstance(value, list) else ("{", "}")
                out.append(self.intern(head + opener + "\n"))
                if isinstance(value, list):
                    out += [self.line(_ELEMENT, v) for v in value]
                else:
                    out += [self.line(k2, v) for k2, v in value.items()]
                out[-1] = self.without_comma(out[-1])
                out.append(self.intern(self.pad1 + closer + end))
            elif type(value) in (dict, list):  # the job, the graph: the same objects in every plan
                memo = (_TOP, key, id(value), end)
                if memo not in self.lines:
                    self.keep.append(value)
                    self.lines[memo] = self.intern(head + self.render(value, self.pad1) + end)
                out.append(self.lines[memo])
            else:
                out.append(self.intern(head + self.render(value, self.pad1) + end))
        out.append(self.intern("}\n"))  # the closing brace and the file's final newline
        return out

    def without_comma(self, piece: int) -> int:
        """The piece of the same line without its comma (the last of a list or dict)."""
        if piece not in self.last:
            self.last[piece] = self.intern(self.pieces[piece][:-2] + "\n")
        return self.last[piece]


def _runs(refs: list[int]) -> list[int]:
    """``[first, count, ...]`` runs of consecutive indices.

    Example:
        >>> _runs([4, 5, 6, 2, 9, 10])
        [4, 3, 2, 1, 9, 2]
    """
    out: list[int] = []
    for i in refs:
        if out and out[-2] + out[-1] == i:
            out[-1] += 1
        else:
            out += [i, 1]
    return out
