"""Fixtures of the Pareto-plot tests: a frontier folder and a headless Chromium (Debian's)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from frontier_fixture import make_frontier_json

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture
def frontier_json() -> dict:
    """The hand-made VGG-like frontier file content (5 device counts, 34 plans)."""
    return make_frontier_json()


@pytest.fixture
def run_dir(tmp_path: Path, frontier_json: dict) -> Path:
    """A run folder holding frontier.json (as `tensoropt plan --out DIR` leaves it)."""
    (tmp_path / "frontier.json").write_text(json.dumps(frontier_json, indent=1) + "\n")
    return tmp_path


@pytest.fixture
def server(run_dir):
    """`tensoropt ui`'s server on a free port, serving run_dir (job file named job.yaml)."""
    from tensoropt.plot.server import ParetoServer

    srv = ParetoServer(run_dir / "frontier.json", port=0, job_file="job.yaml")
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def chromium():
    """A headless Chromium driven by Playwright; fails (never skips) when it is missing."""
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"the browser tests need Chromium at {CHROMIUM}: install Debian's package with "
                    "`apt-get update && apt-get install -y chromium` (`make test` does, as root: "
                    "scripts/install_test_deps.sh); Playwright must not download a browser")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()
