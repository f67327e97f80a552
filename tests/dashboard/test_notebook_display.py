"""`Dashboard(run)` as a cell's value renders inline, and an executed notebook keeps a rendering
that needs no network (BokehJS and Panel's JS inlined, no CDN link)."""

from __future__ import annotations

import re
import sys

import nbformat
import pytest
from nbclient import NotebookClient

SETUP = """\
import gnnpipe as gp
from dashboard import Dashboard
"""
RUN = """\
g = gp.datasets.synthetic(num_nodes=300, avg_degree=6, num_classes=3, num_features=8, seed=0)
run = gp.train(gp.models.gcn(8, hidden=8, out_dim=3, layers=2), g, "local", stages=2, chunks=2,
               epochs=2, progress=False)
Dashboard(run)
"""
#: A <script src> or <link href> tag that loads from the network.
REMOTE = re.compile(r"""<(script|link)\b[^>]*\b(src|href)\s*=\s*\\?["'](https?:)?//""")


def _kernel(tmp_path, monkeypatch) -> str:
    """A kernel spec running this interpreter (as tests/test_notebooks.py does)."""
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    from test_notebooks import _kernel_name

    return _kernel_name(tmp_path, monkeypatch)


@pytest.mark.timeout(300)
def test_dashboard_is_a_cells_value_and_renders_offline(tmp_path, monkeypatch) -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(SETUP),
                                         nbformat.v4.new_code_cell(RUN)])
    NotebookClient(nb, timeout=240, kernel_name=_kernel(tmp_path, monkeypatch)).execute()
    shown = [o for o in nb.cells[1].outputs if o.output_type == "display_data"
             and "text/html" in o.get("data", {})]
    assert len(shown) == 1, nb.cells[1].outputs
    data = shown[0]["data"]
    assert "application/vnd.holoviews_exec.v0+json" in data, sorted(data)
    html = data["text/html"]
    assert "Stage timeline" in html and "Partitions" in html
    setup_text = "".join(str(o.get("data", o.get("text", ""))) for o in nb.cells[0].outputs)
    everything = setup_text + html
    assert len(setup_text) > 1_000_000, "BokehJS was not inlined in the setup cell's output"
    assert not REMOTE.findall(html), "the dashboard's rendering loads a resource remotely"
    remote = [m.group(0) for m in REMOTE.finditer(everything)]
    assert not remote, f"the notebook loads resources remotely: {remote[:3]}"


LIVE = """\
g = gp.datasets.synthetic(num_nodes=400, avg_degree=6, num_classes=3, num_features=8, seed=0)
run = gp.train(gp.models.gcn(8, hidden=8, out_dim=3, layers=4), g, "pipeline", stages=2,
               chunks=4, epochs=40, background=True, progress=False)
Dashboard(run)
"""


@pytest.mark.timeout(420)
def test_a_notebook_of_a_live_run_keeps_the_finished_run(tmp_path, monkeypatch) -> None:
    """The dashboard of a run still training is drawn as it was; once a later cell waits for
    the run, the output is redrawn with the finished run: the saved notebook shows its last
    epoch (and Compare, a cell's value, renders too)."""
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(SETUP), nbformat.v4.new_code_cell(LIVE),
        nbformat.v4.new_code_cell("run.wait()\nfrom dashboard import Compare\nCompare(run, run)")])
    NotebookClient(nb, timeout=300, kernel_name=_kernel(tmp_path, monkeypatch)).execute()
    (shown,) = [o for o in nb.cells[1].outputs if "text/html" in o.get("data", {})]
    html = shown["data"]["text/html"]
    assert "epoch 40 / 40" in html, re.findall(r"epoch \d+ / \d+", html)
    assert "measured, epoch 39" in html
    compare = [o for o in nb.cells[2].outputs if "text/html" in o.get("data", {})]
    assert compare and "epoch_time_s" in compare[0]["data"]["text/html"]


@pytest.mark.timeout(420)
def test_exported_notebook_renders_offline_in_chromium(tmp_path, monkeypatch, browser) -> None:
    """The executed notebook exported to HTML (nbconvert) draws the dashboard in headless
    Chromium with every network request refused: only what the file itself holds renders."""
    from nbconvert import HTMLExporter

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(SETUP),
                                         nbformat.v4.new_code_cell(RUN)])
    NotebookClient(nb, timeout=240, kernel_name=_kernel(tmp_path, monkeypatch)).execute()
    page_file = tmp_path / "dashboard.html"
    page_file.write_text(HTMLExporter().from_notebook_node(nb)[0])
    refused: list[str] = []
    page = browser.new_page()
    try:

        def route(r):
            if r.request.url.startswith("file://"):
                return r.continue_()
            refused.append(r.request.url)
            return r.abort()

        page.route("**/*", route)
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(page_file.as_uri())
        page.wait_for_function("() => window.Bokeh && window.Bokeh.documents.length > 0",
                               timeout=120_000)
        page.locator("canvas").nth(5).wait_for(state="attached", timeout=120_000)  # 6 drawn
        canvases = page.locator("canvas").count()  # (locators see into Bokeh's shadow DOM)
        titles = page.evaluate("""() => [...window.Bokeh.documents].flatMap(d =>
            [...d.all_models].filter(m => m.type === 'Title').map(m => m.text))""")
    finally:
        page.close()
    assert canvases >= 6
    assert any("measured, epoch" in t for t in titles), titles
    assert not [e for e in errors if "Bokeh" in e or "bokeh" in e], errors
