"""`Compare(run_a, run_b)`: two runs side by side: epoch time, bytes per epoch, accuracy and
their stage timelines. Each run is a `Run` (finished or live) or a saved run folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import holoviews as hv
import pandas as pd
import panel as pn

from dashboard import extension
from dashboard.views.timeline import select_epoch, timeline_epochs, timeline_plot
from gnnpipe.core.job import TrainConfig
from gnnpipe.core.timeline import Timeline

extension.load()

__all__ = ["Compare"]


def _parts(run: Any, name: str) -> tuple[TrainConfig | None, pd.DataFrame, Timeline]:
    """``(config, history, timeline)`` of a Run or a saved run folder."""
    if isinstance(run, (str, Path)):
        from dashboard.stream import ReplaySource

        snap = ReplaySource(run).final()
        return snap.config, snap.history, snap.timeline
    if not (hasattr(run, "history") and hasattr(run, "config")):
        raise TypeError(f"{name}: expected a Run or a saved run folder, got {type(run).__name__}")
    timeline = run.live_timeline() if hasattr(run, "live_timeline") else run.timeline
    return run.config, run.history, timeline


def _label(config: TrainConfig | None, fallback: str) -> str:
    if config is None:
        return fallback
    extra = f" S={config.stages} C={config.chunks}" if config.mode.staged else ""
    return f"{fallback}: {config.mode}{extra}"


class Compare:
    """Two runs side by side.

    Args:
        run_a, run_b: `Run` objects or saved run folders (``Run.save``).
        names: Labels of the two runs (default ``"A"``, ``"B"``, with mode, stages, chunks).
    """

    def __init__(self, run_a: Any, run_b: Any, names: tuple[str, str] = ("A", "B")) -> None:
        self.runs = [_parts(run_a, "run_a"), _parts(run_b, "run_b")]
        self.names = [_label(cfg, n) for (cfg, _, _), n in zip(self.runs, names)]

    def table(self) -> pd.DataFrame:
        """One row per run: best epoch and accuracies, median epoch seconds (first epoch skipped
        when there are more) and median bytes per epoch."""
        rows = []
        for name, (_, history, _) in zip(self.names, self.runs):
            h = history.iloc[1:] if len(history) > 1 else history
            best = history.dropna(subset=["val_acc"]) if "val_acc" in history else history
            top = best.loc[best["val_acc"].idxmax()] if len(best) else None
            rows.append({
                "run": name, "epochs": len(history),
                "epoch_time_s": float(h["epoch_time"].median()) if len(h) else float("nan"),
                "bytes_per_epoch": float(h["comm_bytes"].median()) if len(h) else float("nan"),
                "best_val_acc": float(top["val_acc"]) if top is not None else float("nan"),
                "test_acc": float(top["test_acc"]) if top is not None else float("nan"),
            })
        return pd.DataFrame(rows).set_index("run")

    def curves(self) -> hv.Layout:
        """Validation accuracy and epoch time per epoch, both runs on each plot."""
        acc, times = [], []
        for name, (_, history, _) in zip(self.names, self.runs):
            acc.append(hv.Curve(history, "epoch", ("val_acc", "validation accuracy"), label=name))
            times.append(hv.Curve(history, "epoch", ("epoch_time", "epoch (s)"), label=name))
        opts = {"responsive": True, "height": 260, "backend": "bokeh"}
        return (hv.Overlay(acc).opts(title="accuracy", **opts)
                + hv.Overlay(times).opts(title="epoch time", **opts)).cols(2)

    def timelines(self) -> list[Any]:
        """Each run's last epoch as a stage timeline (a note for runs without one)."""
        out: list[pn.viewable.Viewable] = []
        for name, (_, _, timeline) in zip(self.names, self.runs):
            epochs = timeline_epochs(timeline)
            if not epochs:
                out.append(pn.pane.Markdown(f"{name}: no timeline recorded"))
                continue
            shown = select_epoch(timeline, epochs[-1])
            out.append(pn.pane.HoloViews(timeline_plot(shown, title=f"{name}, epoch {epochs[-1]}"),
                                         sizing_mode="stretch_width", linked_axes=False))
        return out

    def panel(self) -> pn.Column:
        """Summary table, accuracy and epoch-time curves, and the two timelines side by side."""
        return pn.Column(
            pn.pane.DataFrame(self.table().round(4), sizing_mode="stretch_width"),
            pn.pane.HoloViews(self.curves(), sizing_mode="stretch_width", linked_axes=False),
            pn.Row(*self.timelines(), sizing_mode="stretch_width"),
            sizing_mode="stretch_width")

    def __panel__(self) -> pn.viewable.Viewable:
        return self.panel()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Any:
        """Jupyter displays a ``Compare`` that is a cell's value as its layout."""
        return self.panel()._repr_mimebundle_(include, exclude)
