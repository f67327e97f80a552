"""Stage timeline view: one lane per rank, one bar per op, coloured by the op-kind scheme of
:mod:`dashboard.style`, with a legend and each lane's bubble."""

from __future__ import annotations

import holoviews as hv
import holoviews.plotting.bokeh  # registers the bokeh options used below
import pandas as pd

from dashboard.style import OP_COLORS, OTHER_COLOR, legend_hook, op_legend
from gnnpipe.core.timeline import Timeline

__all__ = ["COMM_BAND", "COMM_KINDS", "COMPUTE_BAND", "LAYOUT_WIDTH", "MAX_BARS", "lane_labels",
           "latest", "select_epoch", "timeline_epochs", "timeline_frame", "timeline_plot"]

#: Most bars drawn at once: beyond it the latest ops are kept (and the title says so).
MAX_BARS = 20_000
#: Width in px of each plot of a measured-beside-predicted pair (fits a ~1,000-px notebook cell).
LAYOUT_WIDTH = 900

#: A rank's lane, in rank units around its index: compute ops (forward, backward, weight,
#: step) fill the upper band, communication (send, recv, all-reduce) a thin band below it, so
#: an asynchronous send that spans a rank's computing never covers a compute bar.
COMPUTE_BAND = (-0.42, 0.16)
COMM_BAND = (0.22, 0.42)
COMM_KINDS = ("send", "recv", "allreduce")
_VDIMS = ["rank", "stage", "way", "chunk", "epoch", "kind", "bytes", "peer", "color"]
_TOOLTIPS = [
    ("rank", "@rank"), ("kind", "@kind"), ("chunk", "@chunk"), ("epoch", "@epoch"),
    ("start", "@start{0.000000}"), ("end", "@end{0.000000}"),
]


def timeline_epochs(timeline: Timeline, ranks: int = 0) -> list[int]:
    """The distinct epochs a timeline holds, ascending (for an epoch selector); with ``ranks``,
    only those every one of ``ranks`` ranks has reported ops for (a live run's complete ones)."""
    reported = timeline.df.groupby("epoch")["rank"].nunique()
    return sorted(int(e) for e, n in reported.items() if n >= ranks)


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
    """The rows :func:`timeline_plot` draws: the timeline's columns plus the bar's band in its
    rank's lane (``lo``, ``hi``: :data:`COMPUTE_BAND`, or :data:`COMM_BAND` for
    :data:`COMM_KINDS`) and ``color``."""
    df = timeline.df.copy()
    comm = df["kind"].isin(COMM_KINDS)
    df["lo"] = df["rank"] + comm.map({True: COMM_BAND[0], False: COMPUTE_BAND[0]})
    df["hi"] = df["rank"] + comm.map({True: COMM_BAND[1], False: COMPUTE_BAND[1]})
    df["color"] = df["kind"].map(OP_COLORS).fillna(OTHER_COLOR).astype(object)
    return df


def lane_labels(timeline: Timeline, lanes: int = 0) -> list[tuple[int, str]]:
    """Y tick per rank: ``"rank 1 · bubble 12%"``, the rank's idle share of the makespan
    (:meth:`Timeline.bubble_by_rank`, whose mean is the title's bubble); at least ``lanes``."""
    bubble = timeline.bubble_by_rank()
    return [(r, f"rank {r} · bubble {bubble.get(r, 0.0):.0%}")
            for r in range(max(timeline.num_ranks, lanes))]


def _rectangles(timeline: Timeline, title: str, lanes: int = 0) -> hv.Rectangles:
    df = timeline_frame(timeline)
    kdims = [hv.Dimension("start", label="time (s)"), "lo", "end", "hi"]
    ranks = max(timeline.num_ranks, lanes)
    element = hv.Rectangles(df, kdims=kdims, vdims=_VDIMS)
    return element.opts(
        color="color", line_color="white", line_width=0.5,
        tools=["hover"], hover_tooltips=_TOOLTIPS, bgcolor=OP_COLORS["idle"],
        yticks=lane_labels(timeline, lanes) or None, invert_yaxis=True,
        ylim=(-0.5, max(ranks, 1) - 0.5), title=title, ylabel="",
        hooks=[legend_hook(op_legend(), ncols=2)], show_grid=False,
        responsive=True, height=130 + 36 * min(ranks, 32), backend="bokeh",
    )


def _title(timeline: Timeline, name: str | None) -> str:
    stats = f"makespan {timeline.makespan():.4g} s, bubble {timeline.bubble_fraction():.1%}"
    return f"{name}: {stats}" if name else stats


def latest(timeline: Timeline, max_bars: int | None = None) -> tuple[Timeline, str]:
    """The last ``max_bars`` (default :data:`MAX_BARS`) ops by start time, and a note saying
    what was left out ("" if nothing)."""
    max_bars = MAX_BARS if max_bars is None else max_bars
    if len(timeline) <= max_bars:
        return timeline, ""
    kept = timeline.df.nlargest(max_bars, "start").sort_values("start")
    return Timeline(kept), f"last {max_bars:,} of {len(timeline):,} ops · "


def timeline_plot(timeline: Timeline, title: str | None = None,
                  predicted: Timeline | None = None,
                  epoch: int | None = None, lanes: int = 0) -> hv.Rectangles | hv.Layout:
    """Draw a Timeline with one lane per rank and one bar per op.

    Idle time shows as gaps (the lane background, ``idle`` in the legend of the op-kind
    scheme right of the plot); each lane's tick gives that rank's bubble and the title the
    makespan and the mean bubble (``bubble 27.3%``). Above :data:`MAX_BARS` ops only the
    latest are drawn.

    Args:
        timeline: The (measured or predicted) timeline to draw.
        title: Plot title; makespan and bubble fraction are appended.
        predicted: A predicted timeline drawn in a second plot below, on the same
            time axis, for comparison (drawn as given, not filtered by ``epoch``).
        epoch: Draw only this epoch of ``timeline``, re-based to start at 0
            (:func:`select_epoch`); ``None`` draws every epoch.
        lanes: Draw at least this many lanes (a live run's ranks, before all of them have
            reported an op: a streamed plot keeps the height it started with).

    Returns:
        An ``hv.Rectangles`` (bokeh options: colour by kind, hover with chunk, kind,
        start, end), or an ``hv.Layout`` of two when ``predicted`` is given.
    """
    if epoch is not None:
        timeline = select_epoch(timeline, epoch)
    timeline, note = latest(timeline)
    if note:
        title = note + (title or "")
    main = _rectangles(timeline, _title(timeline, title), lanes)
    if predicted is None:
        return main
    other = _rectangles(predicted, _title(predicted, "predicted"))
    # a Layout of responsive plots collapses to no width (in a notebook and in a Panel pane):
    # the two are drawn at a fixed width that fits a notebook cell, on one time axis
    span = (0, max(timeline.makespan(), predicted.makespan()) or 1.0)
    return (main.opts(responsive=False, width=LAYOUT_WIDTH, xlim=span)
            + other.opts(responsive=False, width=LAYOUT_WIDTH, xlim=span)).cols(1)
