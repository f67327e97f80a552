"""Tests for dashboard.views.schedule: the explorer's simulation, bubble, formula and panel."""

from __future__ import annotations

import holoviews as hv
import panel as pn
import pytest
from bokeh.models import Title

from dashboard.views.schedule import BUILDERS, ScheduleExplorer, bubble_formula


def test_defaults_and_param_docs() -> None:
    ex = ScheduleExplorer()
    assert (ex.schedule, ex.stages, ex.chunks) == ("gnnpipe", 4, 8)
    assert (ex.forward, ex.backward, ex.comm) == (1.0, 2.0, 0.0)
    assert ex.param["schedule"].objects == ["gnnpipe", "gpipe", "1f1b"] == list(BUILDERS)
    assert ex.param["stages"].bounds == (1, 16) and ex.param["chunks"].bounds == (1, 64)
    for name in ("schedule", "stages", "chunks", "forward", "backward", "comm"):
        assert ex.param[name].doc
    with pytest.raises(ValueError):
        ex.stages = 17


def test_timeline_follows_parameters() -> None:
    ex = ScheduleExplorer(stages=3, chunks=5)
    tl = ex.timeline()
    assert tl.num_ranks == 3 and len(tl) == 3 * 5 * 2
    assert tl.makespan() == pytest.approx((5 + 3 - 1) * 3.0)  # (C+S-1)(f+b)
    ex.comm = 0.5
    assert ex.timeline().makespan() > tl.makespan()
    ex.schedule = "1f1b"
    assert ex.build().name == "1f1b"


def test_bubble_changes_with_stages_and_chunks() -> None:
    ex = ScheduleExplorer()
    base = ex.bubble()
    ex.stages = 8
    more_stages = ex.bubble()
    ex.chunks = 32
    more_chunks = ex.bubble()
    assert more_stages > base > 0 and more_chunks < more_stages
    ex.stages = 1
    assert ex.bubble() == 0.0


@pytest.mark.parametrize("schedule", ["gnnpipe", "gpipe", "1f1b"])
@pytest.mark.parametrize(("stages", "chunks"), [(1, 1), (2, 1), (2, 3), (4, 8), (8, 4), (5, 16)])
def test_equal_costs_bubble_is_formula(schedule: str, stages: int, chunks: int) -> None:
    ex = ScheduleExplorer(schedule=schedule, stages=stages, chunks=chunks,
                          forward=1.0, backward=1.0, comm=0.0)
    assert ex.formula() == bubble_formula(stages, chunks) == (stages - 1) / (chunks + stages - 1)
    assert ex.bubble() == pytest.approx(ex.formula(), abs=1e-12)


def test_plot_and_summary() -> None:
    ex = ScheduleExplorer(stages=4, chunks=8)
    el = ex.plot()
    assert isinstance(el, hv.Rectangles) and len(el) == 64
    assert el.opts.get().kwargs["title"].endswith("bubble 27.3%")
    assert "bubble 27.3%" in ex.summary() and "(4−1)/(8+4−1)" in ex.summary()


def _titles(model) -> list[str]:
    return [t.text for t in model.select({"type": Title}) if t.text]


def test_panel_renders_and_updates() -> None:
    ex = ScheduleExplorer()
    row = ex.panel()
    assert isinstance(row, pn.Row)
    root = row.get_root()
    assert any("gnnpipe, S=4, C=8" in t and "bubble 27.3%" in t for t in _titles(root))
    plot_pane, text_pane = row[1]
    ex.param.update(stages=2, chunks=3)
    assert plot_pane.object.opts.get().kwargs["title"].startswith("gnnpipe, S=2, C=3")
    assert "bubble 25.0%" in text_pane.object
    assert any("S=2, C=3" in t and "bubble 25.0%" in t for t in _titles(root))
    widgets = row[0]
    assert {"stages", "chunks", "schedule"} <= set(widgets.parameters)
    pn.panel(ex.panel()).get_root()
