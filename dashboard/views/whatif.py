"""What-if view: a run's measured op costs re-simulated under other schedules and chunk counts,
predicted beside measured (:mod:`gnnpipe.analysis.whatif`)."""

from __future__ import annotations

from collections.abc import Iterable

import holoviews as hv
import pandas as pd
import panel as pn

from dashboard.views.timeline import select_epoch, timeline_epochs, timeline_plot
from gnnpipe.analysis.catalogue import build
from gnnpipe.analysis.whatif import OpCosts, costs_from, predict, what_if
from gnnpipe.core.timeline import Timeline

__all__ = ["whatif_panel", "whatif_plot"]


def whatif_plot(table: pd.DataFrame) -> hv.Overlay:
    """Predicted epoch seconds against chunk count, one curve per schedule, and the measured
    epoch as a black point."""
    curves = [hv.Curve(group, "chunks", ("predicted_s", "epoch (s)"), label=name).opts(
                  tools=["hover"])
              * hv.Scatter(group, "chunks", ("predicted_s", "epoch (s)"), label=name).opts(size=5)
              for name, group in table.groupby("schedule", sort=False)]
    measured = table.dropna(subset=["measured_s"])
    point = hv.Scatter(measured, "chunks", ("measured_s", "epoch (s)"), label="measured").opts(
        color="black", size=10, marker="x")
    return hv.Overlay([*curves, point]).opts(
        title="what if: predicted epoch from the run's measured op costs", responsive=True,
        height=320, legend_position="right", xlabel="chunks", backend="bokeh")


def whatif_panel(timeline: Timeline, names: Iterable[str] | None = None,
                 chunk_counts: Iterable[int] | None = None,
                 own: str = "gnnpipe") -> pn.viewable.Viewable:
    """Table and plot of :func:`gnnpipe.analysis.whatif.what_if`, and the run's last epoch drawn above
    the epoch its own costs predict under its own schedule ``own`` (``gnnpipe`` or ``1f1b``); a
    message for timelines without per-chunk ops."""
    try:
        if names is None:
            table = what_if(timeline, chunk_counts=chunk_counts, own=own)
        else:
            table = what_if(timeline, list(names), chunk_counts=chunk_counts, own=own)
    except ValueError as error:
        return pn.pane.Markdown(f"What if needs a pipeline run's per-chunk ops ({error}).")
    costs = costs_from(timeline)
    epochs = timeline_epochs(timeline)
    shown = select_epoch(timeline, epochs[-1]).training()
    predicted = predict(costs, build(own, costs.stages, costs.chunks, step=True))
    span = max(shown.makespan(), predicted.makespan())
    lanes = [timeline_plot(tl, title=title).opts(xlim=(0, span)) for tl, title in (
        (shown, f"measured, epoch {epochs[-1]}"), (predicted, "predicted from its own op costs"))]
    return pn.Column(
        pn.pane.HoloViews(whatif_plot(table), sizing_mode="stretch_width", linked_axes=False),
        pn.pane.DataFrame(table.round(4), index=False, sizing_mode="stretch_width"),  # no extra JS
        pn.pane.Markdown(_note(costs, len(epochs), shown, predicted), sizing_mode="stretch_width"),
        *(pn.pane.HoloViews(lane, sizing_mode="stretch_width", linked_axes=False)
          for lane in lanes),
        sizing_mode="stretch_width")


def _note(costs: OpCosts, epochs: int, measured: Timeline, predicted: Timeline) -> str:
    """Where the costs come from, and why the measured epoch differs from its prediction."""
    gap = measured.makespan() - predicted.makespan()
    return (f"Costs: the median forward and backward of every (stage, chunk) over {epochs} epochs, "
            f"one transfer delay of {costs.comm * 1e3:.3g} ms. Other chunk counts scale each op "
            "by C/C′; interleaved ops cost 1/v of a stage's; ZB-H1 splits backward into halves. "
            f"**Measured {measured.makespan():.4g} s against predicted {predicted.makespan():.4g} s"
            f" ({gap:+.4g} s)** for the run's own schedule: the simulator prices only the ops "
            "and one fixed transfer delay per dependency, so the difference is what it does not "
            "price — a rank blocking on its sends, transfers slower than the median delay, and "
            "the Python between ops (the ranks' communication and idle shares, Stage timeline "
            "card) — or, if negative, ops faster in the last epoch than their medians.")
