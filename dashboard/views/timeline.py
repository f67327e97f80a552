"""Stage timeline view: one lane per rank, one bar per op, coloured by kind."""

from __future__ import annotations

import holoviews as hv
import holoviews.plotting.bokeh  # registers the bokeh options used below
import pandas as pd

from gnnpipe.events import Timeline

#: Bar colour per op kind.
KIND_COLORS: dict[str, str] = {
    "forward": "#4c78a8",
    "backward": "#f58518",
    "send": "#54a24b",
    "recv": "#88d27a",
    "allreduce": "#b279a2",
    "step": "#e45756",
    "idle": "#d3d3d3",
}
#: Colour of kinds missing from :data:`KIND_COLORS`.
OTHER_COLOR = "#7f7f7f"

_LANE = 0.4  # half-height of a lane's bars, in rank units
_VDIMS = ["rank", "stage", "way", "chunk", "epoch", "kind", "bytes", "peer", "color"]
_TOOLTIPS = [
    ("rank", "@rank"), ("kind", "@kind"), ("chunk", "@chunk"), ("epoch", "@epoch"),
    ("start", "@start{0.000000}"), ("end", "@end{0.000000}"),
]


def timeline_epochs(timeline: Timeline) -> list[int]:
    """The distinct epochs a timeline holds, ascending (for an epoch selector)."""
    return sorted(int(e) for e in timeline.df["epoch"].unique())


def select_epoch(timeline: Timeline, epoch: int) -> Timeline:
    """The ops of one ``epoch``, re-based so that the epoch's first op starts at 0.

    An epoch the timeline does not hold gives an empty Timeline. The input is unchanged.
    """
    df = timeline.df[timeline.df["epoch"] == int(epoch)].copy()
    if len(df):
        origin = df["start"].min()
        df["start"] -= origin
        df["end"] -= origin
    return Timeline(df)


def timeline_frame(timeline: Timeline) -> pd.DataFrame:
    """The rows :func:`timeline_plot` draws: the timeline's columns plus the bar's lane
    bounds (``lo``, ``hi``) and ``color``."""
    df = timeline.df.copy()
    df["lo"] = df["rank"] - _LANE
    df["hi"] = df["rank"] + _LANE
    df["color"] = df["kind"].map(KIND_COLORS).fillna(OTHER_COLOR).astype(object)
    return df


def _rectangles(timeline: Timeline, title: str) -> hv.Rectangles:
    df = timeline_frame(timeline)
    kdims = [hv.Dimension("start", label="time (s)"), "lo", "end", "hi"]
    ranks = range(timeline.num_ranks)
    element = hv.Rectangles(df, kdims=kdims, vdims=_VDIMS)
    return element.opts(
        color="color", line_color="white", line_width=0.5,
        tools=["hover"], hover_tooltips=_TOOLTIPS,
        yticks=[(r, f"rank {r}") for r in ranks] or None, invert_yaxis=True,
        ylim=(-0.5, max(timeline.num_ranks, 1) - 0.5), title=title, ylabel="rank",
        responsive=True, height=80 + 40 * len(ranks), backend="bokeh",
    )


def _title(timeline: Timeline, name: str | None) -> str:
    stats = (f"{timeline.num_ranks} ranks, makespan {timeline.makespan():.4g} s, "
             f"bubble {timeline.bubble_fraction():.1%}")
    return f"{name}: {stats}" if name else stats


def timeline_plot(timeline: Timeline, title: str | None = None,
                  predicted: Timeline | None = None,
                  epoch: int | None = None) -> hv.Rectangles | hv.Layout:
    """Draw a Timeline with one lane per rank and one bar per op.

    Idle time shows as gaps between bars; the title carries the rank count, the makespan
    and the bubble fraction (``bubble 27.3%``).

    Args:
        timeline: The (measured or predicted) timeline to draw.
        title: Plot title; makespan and bubble fraction are appended.
        predicted: A predicted timeline drawn in a second plot below, on the same
            time axis, for comparison (drawn as given, not filtered by ``epoch``).
        epoch: Draw only this epoch of ``timeline``, re-based to start at 0
            (:func:`select_epoch`); ``None`` draws every epoch.

    Returns:
        An ``hv.Rectangles`` (bokeh options: colour by kind, hover with chunk, kind,
        start, end), or an ``hv.Layout`` of two when ``predicted`` is given.
    """
    if epoch is not None:
        timeline = select_epoch(timeline, epoch)
    main = _rectangles(timeline, _title(timeline, title))
    if predicted is None:
        return main
    other = _rectangles(predicted, _title(predicted, "predicted"))
    return (main + other).cols(1)
