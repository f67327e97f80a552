"""What-if view: a run's measured op costs re-simulated under other schedules and chunk counts,
predicted beside measured (:mod:`gnnpipe.analysis.whatif`)."""

from __future__ import annotations

from collections.abc import Iterable

import holoviews as hv
import pandas as pd
import panel as pn

from dashboard.views.timeline import select_epoch, timeline_epochs, timeline_plot
from gnnpipe.analysis.catalogue import build
from gnnpipe.analysis.whatif import costs_from, predict, what_if
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
                 chunk_counts: Iterable[int] | None = None) -> pn.viewable.Viewable:
    """Table and plot of :func:`gnnpipe.analysis.whatif.what_if`, and the run's last epoch drawn above
    the epoch its own costs predict; a message for timelines without per-chunk ops."""
    try:
        if names is None:
            table = what_if(timeline, chunk_counts=chunk_counts)
        else:
            table = what_if(timeline, list(names), chunk_counts=chunk_counts)
    except ValueError as error:
        return pn.pane.Markdown(f"What if needs a pipeline run's per-chunk ops ({error}).")
    costs = costs_from(timeline)
    epochs = timeline_epochs(timeline)
    shown = select_epoch(timeline, epochs[-1])
    predicted = predict(costs, build("gnnpipe", costs.stages, costs.chunks, step=True))
    lanes = timeline_plot(shown, title=f"measured, epoch {epochs[-1]}", predicted=predicted)
    note = (f"Costs: median forward/backward per (stage, chunk) over {len(epochs)} epochs, "
            f"transfer {costs.comm * 1e3:.3g} ms. Other chunk counts scale each op by C/C'; "
            "interleaved ops cost 1/v of a stage's; ZB-H1 splits backward into halves.")
    return pn.Column(
        pn.pane.HoloViews(whatif_plot(table), sizing_mode="stretch_width", linked_axes=False),
        pn.pane.DataFrame(table.round(4), index=False, sizing_mode="stretch_width"),  # no extra JS
        pn.pane.Markdown(note),
        pn.pane.HoloViews(lanes, sizing_mode="stretch_width", linked_axes=False),
        sizing_mode="stretch_width")
