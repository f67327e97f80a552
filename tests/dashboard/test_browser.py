"""The dashboard served for a live pipeline run, opened in a real headless Chromium."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

import gnnpipe as gp
from dashboard.app import CURVE_NAME, Dashboard

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
VIEWS = ["Training", "Stage timeline", "Communication", "Partitions", "Schedule explorer"]

COUNT_POINTS = f"""() => {{
  let n = 0;
  for (const doc of window.Bokeh.documents)
    for (const m of doc.all_models)
      if (m.name === '{CURVE_NAME}') {{
        const cols = Object.values(m.data_source.data);
        if (cols.length) n = Math.max(n, cols[0].length);
      }}
  return n;
}}"""


@pytest.fixture
def browser():
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium not found at {CHROMIUM}: .ci/run installs Debian's chromium package")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        yield b
        b.close()


def _stop(run, cluster) -> None:
    """Stop the endless run; if it does not stop in time, restart the workers so later tests
    get a free cluster."""
    run.stop()
    try:
        run.wait(timeout=120)
    except TimeoutError:
        cluster.restart()
        raise


def _points(page, at_least: int, timeout: float = 120.0) -> int:
    deadline = time.monotonic() + timeout
    n = 0
    while time.monotonic() < deadline:
        n = page.evaluate(COUNT_POINTS)
        if n >= at_least:
            return n
        time.sleep(0.25)
    return n


def test_live_dashboard_in_chromium(cluster, small_graph, browser, tmp_path):
    model = gp.models.gcnii(small_graph.num_features, hidden=16, out_dim=4, layers=6)
    run = gp.train(model, small_graph, "pipeline", stages=2, chunks=4, epochs=100_000,
                   cluster=cluster, background=True, progress=False)
    server, url = Dashboard(run, refresh_ms=250).serve()
    try:
        assert url.startswith("http://127.0.0.1:")
        page = browser.new_page(viewport={"width": 1400, "height": 2400})
        page.goto(url, wait_until="networkidle", timeout=120_000)
        for view in VIEWS:
            page.get_by_text(view, exact=True).first.wait_for(timeout=90_000)
        page.wait_for_selector(".bk-Canvas, canvas", timeout=90_000)
        first = _points(page, at_least=1)
        assert first >= 1, "the training curve never showed an epoch"
        second = _points(page, at_least=first + 2)
        assert second > first, f"the curve did not grow: {first} -> {second} points"
        assert page.locator("canvas").count() >= 6  # every view drew its plots
        _stop(run, cluster)  # the page takes the final history, then stops updating
        final = _points(page, at_least=len(run.history))
        assert final == len(run.history) >= second, f"{final} points for {len(run.history)} epochs"
        shots = Path(os.environ.get("GNNPIPE_SCREENSHOTS", tmp_path))  # docs/ for the README
        shots.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shots / "dashboard_live.png"), full_page=True, timeout=120_000)
        assert (shots / "dashboard_live.png").stat().st_size > 10_000
    finally:
        server.stop()
        if not run.done:
            _stop(run, cluster)
    assert run.done


def test_explorer_alone_in_chromium(browser):
    server, url = Dashboard(None).serve()
    try:
        page = browser.new_page()
        page.goto(url, wait_until="networkidle", timeout=120_000)
        page.get_by_text("Schedule explorer").first.wait_for(timeout=90_000)
        assert page.locator("canvas").count() >= 1
    finally:
        server.stop()
