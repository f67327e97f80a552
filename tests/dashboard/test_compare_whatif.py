"""Tests for dashboard.compare.Compare and dashboard.views.whatif: they render (a Bokeh model
builds) and show the runs' numbers."""

from __future__ import annotations

import holoviews as hv
import pandas as pd
import panel as pn
import pytest
from bokeh.models import Title

from dashboard.compare import Compare
from dashboard.views.whatif import whatif_panel, whatif_plot
from gnnpipe import schedule
from gnnpipe.analysis.whatif import what_if
from gnnpipe.core.job import TrainConfig
from gnnpipe.run import Run
from gnnpipe.schedule.simulator import simulate

COSTS = {"forward": 1.0, "backward": 2.0, "step": 0.5}


def _run(mode: str, chunks: int, epoch_time: float, nbytes: int, acc: float) -> Run:
    tl = simulate(schedule.gnnpipe(2, chunks, step=True), COSTS, comm=0.25)
    history = pd.DataFrame({
        "epoch": [0, 1, 2], "loss": [1.0, 0.8, 0.7], "train_acc": [0.5, 0.6, 0.7],
        "val_acc": [0.4, acc, acc - 0.1], "test_acc": [0.4, acc - 0.05, 0.3],
        "val_loss": [1.0, 0.9, 0.95], "epoch_time": [9.0, epoch_time, epoch_time],
        "comm_bytes": [nbytes] * 3})
    return Run(TrainConfig.from_dict({"mode": mode, "stages": 2, "chunks": chunks}), history=history,
               timeline=tl)


def _titles(model) -> list[str]:
    return [t.text for t in model.select({"type": Title}) if t.text]


def test_compare_table_and_render(tmp_path) -> None:
    a, b = _run("pipeline", 4, 2.0, 1000, 0.8), _run("pipeline", 8, 1.5, 3000, 0.7)
    saved = b.save(tmp_path / "b")
    cmp = Compare(a, saved)
    table = cmp.table()
    assert list(table.index) == ["A: pipeline S=2 C=4", "B: pipeline S=2 C=8"]
    assert table["epoch_time_s"].tolist() == [2.0, 1.5]
    assert table["bytes_per_epoch"].tolist() == [1000, 3000]
    assert table["best_val_acc"].tolist() == pytest.approx([0.8, 0.7])
    assert table["test_acc"].tolist() == pytest.approx([0.75, 0.65])
    root = pn.panel(cmp).get_root()
    titles = _titles(root)
    assert any(t.startswith("A: pipeline S=2 C=4, epoch 0") for t in titles)
    assert any(t.startswith("B: pipeline S=2 C=8, epoch 0") for t in titles)
    with pytest.raises(TypeError, match="^run_b: expected a Run"):
        Compare(a, 42)


def test_compare_run_without_timeline() -> None:
    a = _run("pipeline", 4, 2.0, 1000, 0.8)
    b = Run(TrainConfig.from_dict({"mode": "single"}), history=a.history)
    pn.panel(Compare(a, b)).get_root()
    assert "B: single" in Compare(a, b).table().index


def test_whatif_panel_renders_with_predicted_beside_measured() -> None:
    tl = _run("pipeline", 4, 2.0, 1000, 0.8).timeline
    table = what_if(tl, chunk_counts=[2, 4, 8])
    assert isinstance(whatif_plot(table), hv.Overlay)
    view = whatif_panel(tl, chunk_counts=[2, 4, 8])
    titles = _titles(view.get_root())
    assert any(t.startswith("measured, epoch 0") for t in titles)
    # The run's own costs predict its own epoch exactly: the same makespan in both titles.
    predicted = [t for t in titles if t.startswith("predicted")]
    assert predicted and f"makespan {tl.makespan():.4g} s" in predicted[0]
    measured_pane, _predicted = [p for p in view if isinstance(p, pn.pane.HoloViews)][1:]
    assert isinstance(measured_pane.object, hv.Overlay | hv.Rectangles)  # two plots, no Layout
    note = next(p.object for p in view if isinstance(p, pn.pane.Markdown))
    assert f"Measured {tl.makespan():.4g} s against predicted {tl.makespan():.4g} s" in note
    graph = Run(TrainConfig.from_dict({"mode": "graph"})).timeline
    assert "What if needs" in whatif_panel(graph).object
