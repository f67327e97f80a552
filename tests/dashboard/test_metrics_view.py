"""Tests for dashboard.views.metrics: loss/accuracy curves, epoch time and progress text."""

from __future__ import annotations

import holoviews as hv
import numpy as np
import pandas as pd
import pytest

from dashboard.views.metrics import (
    CURVE_COLORS,
    epoch_time_plot,
    progress_text,
    training_curves,
)
from gnnpipe.run import HISTORY_COLUMNS


@pytest.fixture
def history() -> pd.DataFrame:
    return pd.DataFrame({
        "epoch": range(5),
        "loss": [2.0, 1.5, 1.2, 1.0, 0.9],
        "train_acc": [0.2, 0.4, 0.6, 0.7, 0.8],
        "val_acc": [0.2, 0.4, 0.5, 0.5, 0.45],
        "test_acc": [0.2, 0.35, 0.55, 0.81, 0.4],
        "val_loss": [2.0, 1.6, 1.3, 1.25, 1.3],
        "epoch_time": [0.3, 0.1, 0.2, 0.1, 0.1],
        "comm_bytes": [0] * 5,
    }, columns=list(HISTORY_COLUMNS))


def test_training_curves_loss_and_accuracies(history) -> None:
    layout = training_curves(history)
    assert isinstance(layout, hv.Layout) and len(layout) == 2
    loss, acc = layout
    assert [c.vdims[0].name for c in loss] == ["loss", "val_loss"]
    assert [c.vdims[0].name for c in acc] == ["train_acc", "val_acc", "test_acc"]
    for overlay in (loss, acc):
        for curve in overlay:
            assert [d.name for d in curve.kdims] == ["epoch"]
            np.testing.assert_array_equal(curve.dimension_values("epoch"), range(5))
            name = curve.vdims[0].name
            np.testing.assert_allclose(curve.dimension_values(name), history[name])
            assert curve.opts.get().kwargs["color"] == CURVE_COLORS[name]
    assert [c.label for c in acc] == ["train", "val", "test"]
    hv.render(layout, backend="bokeh")


def test_training_curves_without_val_loss_and_empty(history) -> None:
    loss, _ = training_curves(history.drop(columns="val_loss"))
    assert len(loss) == 1
    empty = training_curves(history.iloc[:0])
    assert all(len(c) == 0 for overlay in empty for c in overlay)
    hv.render(empty, backend="bokeh")


def test_epoch_time_plot(history) -> None:
    el = epoch_time_plot(history)
    assert isinstance(el, hv.Curve)
    np.testing.assert_allclose(el.dimension_values("epoch_time"), history["epoch_time"])
    assert el.dimension_values("epoch_time").sum() == pytest.approx(0.8)
    assert hv.render(el, backend="bokeh").title.text == "epoch time: median 0.1 s"
    hv.render(epoch_time_plot(history.iloc[:0]), backend="bokeh")


def test_progress_text(history) -> None:
    # Epochs 2 and 3 tie on val_acc 0.5; epoch 3 has the lower val_loss.
    assert progress_text(history, 200) == "epoch 5 / 200 · best test 0.81 at epoch 3"
    assert progress_text(history.iloc[:2], 10) == "epoch 2 / 10 · best test 0.35 at epoch 1"
    assert progress_text(history) == "epoch 5 · best test 0.81 at epoch 3"
    assert progress_text(history.iloc[:0], 200) == "epoch 0 / 200 · waiting for the first epoch"
    no_val_loss = history.drop(columns="val_loss")
    assert progress_text(no_val_loss, 5) == "epoch 5 / 5 · best test 0.55 at epoch 2"
