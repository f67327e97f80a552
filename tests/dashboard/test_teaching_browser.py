"""The explorer and the timelines as a class sees them, measured from the rendered page in
headless Chromium: plots at least 500 px wide and titles that fit at 1,280 × 720 (a projector)
and 1,000 px (a Jupyter cell), one time cursor on both schedules, compute bars never covered by
communication on a real run's timeline, and the what-if card's timelines drawn."""

from __future__ import annotations

import socket

import panel as pn
import pytest

import gnnpipe as gp
from dashboard.app import Dashboard
from dashboard.views.schedule import ScheduleExplorer
from dashboard.views.timeline import COMM_KINDS

VIEWPORTS = [(1280, 720), (1000, 800)]

#: Every Bokeh figure on the page: its rendered width, title text and font, cursor positions,
#: and the columns of its glyphs' data sources (walking Bokeh's views from the roots).
FIGURES = """() => {
  const out = [];
  const walk = (v) => {
    if (!v) return;
    const m = v.model;
    if (m && m.type === 'Figure') {
      const t = m.title;
      out.push({
        width: v.el.getBoundingClientRect().width,
        title: t ? t.text : '',
        font: t ? `${t.text_font_style} ${t.text_font_size} ${t.text_font}` : '',
        spans: [...m.center, ...m.renderers].filter(a => a.type === 'Span')
                                            .map(a => a.location),
        sources: m.renderers.filter(r => r.data_source && r.data_source.data)
                            .map(r => r.data_source.data),
      });
    }
    for (const c of (v.child_views || [])) walk(c);
  };
  const roots = Bokeh.index.values ? [...Bokeh.index.values()] : Object.values(Bokeh.index);
  roots.forEach(walk);
  return out;
}"""
#: The width ``text`` takes in ``font`` on this page.
TEXT_WIDTH = """([text, font]) => {
  const ctx = document.createElement('canvas').getContext('2d');
  ctx.font = font;
  return ctx.measureText(text).width;
}"""


def _serve(view) -> tuple[object, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = pn.serve({"/": view}, port=port, address="127.0.0.1", show=False, threaded=True,
                      start=True, verbose=False, websocket_origin=[f"127.0.0.1:{port}"])
    return server, f"http://127.0.0.1:{port}/"


def _figures(browser, url: str, size: tuple[int, int], wait_for: str, expand: str = ""):
    page = browser.new_page(viewport={"width": size[0], "height": size[1]})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    try:
        page.goto(url, wait_until="networkidle", timeout=120_000)
        page.get_by_text(wait_for).first.wait_for(timeout=90_000)
        if expand:
            page.get_by_text(expand, exact=True).first.click()
        page.wait_for_function(f"() => ({FIGURES})().filter(f => f.width > 0).length >= 2",
                               timeout=60_000)
        page.wait_for_timeout(500)  # layout settles after the last figure appears
        figures = page.evaluate(FIGURES)
        for fig in figures:
            fig["title_px"] = page.evaluate(TEXT_WIDTH, [fig["title"], fig["font"]])
    finally:
        page.close()
    assert not errors, errors[:5]
    return figures


def _legible(figures, prefixes: tuple[str, ...]) -> None:
    shown = [f for f in figures if f["title"].startswith(prefixes)]
    assert len(shown) >= len(prefixes), [f["title"] for f in figures]
    for fig in shown:
        assert fig["width"] >= 500, (fig["title"], fig["width"])
        # the title starts after the lane labels (~110 px) and must end before the toolbar
        assert fig["title_px"] + 110 + 40 <= fig["width"], (fig["title"], fig["title_px"])


@pytest.mark.parametrize("size", VIEWPORTS, ids=[f"{w}x{h}" for w, h in VIEWPORTS])
def test_the_explorer_reads_at_projector_and_notebook_widths(browser, size):
    explorer = ScheduleExplorer(schedule="gnnpipe", other="torch:ZBVZeroBubble", stages=4,
                                chunks=8, step=17)
    server, url = _serve(explorer.panel)
    try:
        figures = _figures(browser, url, size, "Symbols.")
    finally:
        server.stop()
    _legible(figures, ("gnnpipe, S=4", "torch:ZBVZeroBubble, S=4"))
    cursors = [f["spans"] for f in figures if f["spans"]]
    assert len(cursors) == 2 and cursors[0] == cursors[1] == [pytest.approx(explorer.now())]
    assert explorer.now() > 0


@pytest.fixture(scope="module")
def pipeline_run(cluster, small_graph):
    model = gp.models.gcnii(small_graph.num_features, hidden=16, out_dim=4, layers=4)
    return gp.train(model, small_graph, "pipeline", stages=2, chunks=8, epochs=4,
                    cluster=cluster, progress=False)


@pytest.mark.parametrize("size", VIEWPORTS, ids=[f"{w}x{h}" for w, h in VIEWPORTS])
def test_a_real_runs_timelines_show_every_compute_bar(browser, pipeline_run, size):
    server, url = Dashboard(pipeline_run).serve()
    try:
        figures = _figures(browser, url, size, "Stage timeline", expand="What if")
    finally:
        server.stop()
    _legible(figures, ("measured, epoch 3", "predicted from its own op costs"))
    lanes = [s for f in figures if f["title"].startswith("measured, epoch")
             for s in f["sources"] if "kind" in s and "lo" in s]
    assert len(lanes) == 2  # the Stage timeline card's and the what-if card's
    for data in lanes:
        rows = list(zip(data["rank"], data["kind"], data["lo"], data["hi"]))
        assert any(k == "forward" for _, k, _, _ in rows) and any(k in COMM_KINDS
                                                                  for _, k, _, _ in rows)
        for rank in {r for r, *_ in rows}:
            compute = [(lo, hi) for r, k, lo, hi in rows if r == rank and k not in COMM_KINDS]
            comm = [(lo, hi) for r, k, lo, hi in rows if r == rank and k in COMM_KINDS]
            assert max(hi for _, hi in compute) < min(lo for lo, _ in comm)  # bands apart
    predicted = next(f for f in figures if f["title"].startswith("predicted from its own"))
    assert any(len(s.get("kind", [])) > 0 for s in predicted["sources"])  # it has glyphs
