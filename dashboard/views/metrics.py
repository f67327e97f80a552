"""Training views: loss and accuracy curves, epoch time, and a one-line progress summary."""

from __future__ import annotations

import holoviews as hv
import holoviews.plotting.bokeh  # registers the bokeh options used below
import pandas as pd

from gnnpipe.run import best_epoch

__all__ = ["CURVE_COLORS", "CURVE_LABELS", "accuracy_plot", "epoch_time_plot", "loss_plot",
           "progress_text", "training_curves"]

#: Line colour per history column drawn by :func:`training_curves`.
CURVE_COLORS: dict[str, str] = {
    "loss": "#4c78a8",
    "val_loss": "#f58518",
    "train_acc": "#4c78a8",
    "val_acc": "#f58518",
    "test_acc": "#54a24b",
}
#: Legend label per history column.
CURVE_LABELS: dict[str, str] = {
    "loss": "train loss", "val_loss": "val loss",
    "train_acc": "train", "val_acc": "val", "test_acc": "test",
}


def _curve(history: pd.DataFrame, column: str, ylabel: str) -> hv.Curve:
    """One history column against ``epoch`` (NaN rows dropped)."""
    df = history.loc[:, ["epoch", column]].astype({"epoch": "int64", column: "float64"}).dropna()
    return hv.Curve(df, kdims=["epoch"], vdims=[hv.Dimension(column, label=ylabel)],
                    label=CURVE_LABELS.get(column, column)).opts(
        color=CURVE_COLORS.get(column, "#7f7f7f"), tools=["hover"], backend="bokeh")


def _has(history: pd.DataFrame, column: str) -> bool:
    return column in history.columns and bool(history[column].notna().any())


def loss_plot(history: pd.DataFrame) -> hv.Overlay:
    """Training loss per epoch, with validation loss when the history has it."""
    columns = ["loss"] + (["val_loss"] if _has(history, "val_loss") else [])
    return hv.Overlay([_curve(history, c, "loss") for c in columns]).opts(
        title="loss", legend_position="top_right", responsive=True, height=280,
        backend="bokeh")


def accuracy_plot(history: pd.DataFrame) -> hv.Overlay:
    """Train, validation and test accuracy per epoch, overlaid."""
    curves = [_curve(history, c, "accuracy") for c in ("train_acc", "val_acc", "test_acc")]
    return hv.Overlay(curves).opts(
        title="accuracy", legend_position="bottom_right", ylim=(0, 1.02), responsive=True,
        height=280, backend="bokeh")


def training_curves(history: pd.DataFrame) -> hv.Layout:
    """Loss and accuracy against epoch, side by side.

    Args:
        history: ``Run.history`` (``epoch``, ``loss``, ``train_acc``, ``val_acc``,
            ``test_acc``, optionally ``val_loss``); may be empty.

    Returns:
        ``hv.Layout`` of :func:`loss_plot` and :func:`accuracy_plot`: overlays of
        ``hv.Curve`` with kdim ``epoch`` and the history column as vdim.
    """
    return (loss_plot(history) + accuracy_plot(history)).opts(shared_axes=False)


def epoch_time_plot(history: pd.DataFrame) -> hv.Curve:
    """Seconds per epoch (``history.epoch_time``); the title gives the median."""
    curve = _curve(history, "epoch_time", "seconds")
    times = curve.dimension_values("epoch_time")
    title = "epoch time" + (f": median {pd.Series(times).median():.3g} s" if len(times) else "")
    return curve.relabel("epoch time").opts(
        title=title, color="#b279a2", responsive=True, height=280, backend="bokeh")


def progress_text(history: pd.DataFrame, total_epochs: int | None = None) -> str:
    """A one-line summary such as ``"epoch 12 / 200 · best test 0.81 at epoch 9"``.

    The first number counts finished epochs (last ``epoch`` + 1, epochs being numbered from
    0); "best" is the test accuracy at the best validation epoch (:func:`gnnpipe.run.best_epoch`),
    with that epoch's number as the history records it.
    """
    total = f" / {int(total_epochs)}" if total_epochs is not None else ""
    if history.empty:
        return f"epoch 0{total} · waiting for the first epoch"
    done = int(history["epoch"].max()) + 1
    if "val_loss" not in history.columns:  # best_epoch breaks ties by validation loss
        history = history.assign(val_loss=float("nan"))
    best = best_epoch(history)
    return f"epoch {done}{total} · best test {best['test_acc']:.2f} at epoch {best['epoch']}"
