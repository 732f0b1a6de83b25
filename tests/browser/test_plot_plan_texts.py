"""The page's fast plan.json texts (whole, or as shared pieces) equal tensoropt.plans.plan_file_text,
whatever its format."""

from __future__ import annotations

import json

import pytest

import tensoropt.plans
from tensoropt.plans import pack_frontier_json, plan_file_text
from tensoropt.plot.plan_texts import all_plan_texts, joined_text, plan_text_pieces


def _ids(frontier_json: dict) -> list[str]:
    return [p["id"] for f in frontier_json["frontiers"] for p in f["plans"]]


def _changed_format(monkeypatch, dumps):
    """Make tensoropt.plans.plan_file_text write its JSON with ``dumps``; return that renderer."""
    original = tensoropt.plans.plan_file_text

    def variant(fj: dict, plan_id: str) -> str:
        return dumps(json.loads(original(fj, plan_id))) + "\n"

    monkeypatch.setattr(tensoropt.plans, "plan_file_text", variant)
    return variant


def test_every_plan_text_is_exact(frontier_json):
    texts = all_plan_texts(frontier_json)
    assert list(texts) == _ids(frontier_json)
    for plan_id, text in texts.items():
        assert text == plan_file_text(frontier_json, plan_id), plan_id


@pytest.mark.parametrize("dumps", [
    lambda obj: json.dumps(obj, indent=2, sort_keys=True),  # another indentation, sorted keys
    lambda obj: json.dumps(obj),  # not indented: the fast path does not apply
    lambda obj: json.dumps({**obj, "job": {"rewritten": True}}, indent=1),  # shared part changed
])
def test_a_changed_file_format_is_followed(frontier_json, monkeypatch, dumps):
    variant = _changed_format(monkeypatch, dumps)
    texts = all_plan_texts(frontier_json)
    for plan_id in _ids(frontier_json):
        assert texts[plan_id] == variant(frontier_json, plan_id), plan_id


@pytest.mark.parametrize("form", ["inline", "shared"])
def test_the_page_pieces_put_together_are_every_plan_text(frontier_json, form):
    """The page stores each distinct line-piece once; each plan's runs of them give its exact text,
    from a frontier of either form (version 1 inline rows, version 2 shared rows)."""
    fj = frontier_json if form == "inline" else pack_frontier_json(frontier_json)
    pieces, texts = plan_text_pieces(fj)
    assert list(texts) == _ids(frontier_json)
    total = 0
    for plan_id, runs in texts.items():
        text = plan_file_text(frontier_json, plan_id)
        assert joined_text(pieces, runs) == text, plan_id
        total += len(text)
    assert len(set(pieces)) == len(pieces) and sum(map(len, pieces)) < total / 2


@pytest.mark.parametrize("dumps", [
    lambda obj: json.dumps(obj, indent=2),  # another indentation
    lambda obj: json.dumps({**obj, "job": {"rewritten": True}}, indent=1),  # a part changed
])
def test_the_page_pieces_follow_a_changed_file_format(frontier_json, monkeypatch, dumps):
    variant = _changed_format(monkeypatch, dumps)
    pieces, texts = plan_text_pieces(frontier_json)
    for plan_id in _ids(frontier_json):
        assert joined_text(pieces, texts[plan_id]) == variant(frontier_json, plan_id), plan_id
