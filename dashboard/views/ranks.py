"""Per-rank views: where each rank's epoch goes (compute, communication, waiting, idle) and the
parallel efficiency per epoch, from :mod:`gnnpipe.analysis.efficiency`."""

from __future__ import annotations

import holoviews as hv
import holoviews.plotting.bokeh  # registers the bokeh options used below
import pandas as pd

from dashboard.style import CLASS_COLORS, categorical_ticks, percent_axis
from gnnpipe.analysis.efficiency import CLASSES, Layout, efficiency, rank_breakdown, rank_shares
from gnnpipe.core.job import TrainConfig
from gnnpipe.core.timeline import Timeline

__all__ = ["efficiency_plot", "epoch_relation", "memory_table", "rank_figures", "shares_plot",
           "shares_table"]

_SHARE_COLUMNS = ["rank", "class", "share"]


def rank_figures(timeline: Timeline,
                 config: TrainConfig | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(rank_shares, efficiency)`` of a run's timeline, as ``Run.rank_shares()`` and
    ``Run.efficiency()`` give them (empty frames for one-process runs or no ops yet)."""
    layout = Layout.of(config)
    if layout is None or not len(timeline):
        return pd.DataFrame(columns=list(CLASSES)), pd.DataFrame(columns=["epoch", "efficiency"])
    return rank_shares(timeline), efficiency(timeline, layout)


def shares_plot(shares: pd.DataFrame, ranks: int = 0) -> hv.Bars:
    """Stacked bars, one per rank, of its median share of the epoch in each class.

    Element data: kdims ``rank`` (str) and ``class`` (in :data:`gnnpipe.analysis.efficiency.CLASSES`
    order), vdim ``share``; ``ranks × 4`` rows, coloured by class
    (:data:`dashboard.style.CLASS_COLORS`) with a legend. Before any op (``shares`` empty),
    ``ranks`` zero bars: the same element, so a streamed plot can fill them in later (none:
    an empty plot).
    """
    title = "share of each rank's epoch"
    if shares.empty and not ranks:  # a one-process run: no ranks, ever
        return hv.Bars([], "rank", "share").opts(title=title + ": no ranks", responsive=True,
                                                 height=320, backend="bokeh")
    if shares.empty:
        shares = pd.DataFrame(0.0, index=range(ranks), columns=list(CLASSES))
        title += ": no ops yet"
    rows = [{"rank": str(rank), "class": c, "share": float(shares.loc[rank, c])}
            for rank in shares.index for c in CLASSES]
    df = pd.DataFrame(rows, columns=_SHARE_COLUMNS)
    names = [str(r) for r in shares.index]
    kdims = [hv.Dimension("rank", values=names), hv.Dimension("class", values=list(CLASSES))]
    return hv.Bars(df, kdims=kdims, vdims=["share"]).opts(
        stacked=True, cmap=CLASS_COLORS, line_color="white", tools=["hover"], ylim=(0, 1.0),
        title=title, hooks=[percent_axis()], ylabel="", xlabel="rank",
        show_legend=True, legend_position="right", responsive=True, height=320,
        backend="bokeh", **categorical_ticks(len(names)),
    )


def efficiency_plot(per_epoch: pd.DataFrame) -> hv.Curve:
    """Parallel efficiency (ideal ÷ measured epoch) per epoch, on 0–100%."""
    df = per_epoch.loc[:, ["epoch", "efficiency"]].astype({"epoch": "int64",
                                                         "efficiency": "float64"})
    title = "parallel efficiency"
    if len(df):
        title += f": median {df['efficiency'].median():.0%}"
    top = max(1.05, float(df["efficiency"].max()) * 1.05 if len(df) else 0.0)
    return hv.Curve(df, kdims=["epoch"], vdims=["efficiency"]).opts(
        color=CLASS_COLORS["compute"], line_width=2, tools=["hover"], ylim=(0, top),
        hooks=[percent_axis()], title=title, ylabel="", responsive=True, height=320,
        backend="bokeh")


def shares_table(shares: pd.DataFrame, per_epoch: pd.DataFrame) -> str:
    """Markdown: per rank, each class's median share; then the median efficiency."""
    if shares.empty:
        return "One-process run, or no epoch measured yet: no per-rank breakdown."
    head = "| rank | " + " | ".join(CLASSES) + " |\n|---|" + "---|" * len(CLASSES) + "\n"
    body = "".join(f"| {rank} | " + " | ".join(f"{shares.loc[rank, c]:.0%}" for c in CLASSES)
                   + " |\n" for rank in shares.index)
    median = per_epoch["efficiency"].median() if len(per_epoch) else float("nan")
    return head + body + f"\nparallel efficiency (median over epochs): **{median:.0%}**"


def epoch_relation(timeline: Timeline, config: TrainConfig | None, epoch: int) -> str:
    """Markdown: one epoch's figures and how they relate (:mod:`gnnpipe.analysis.efficiency`):
    the ranks' mean shares, the bubble ``1 − compute`` (the timeline's title) and the efficiency
    ``(1 − bubble) × (C′ + S − 1)/C′``; ``""`` for a one-process run or an epoch not measured."""
    layout = Layout.of(config)
    per_rank = rank_breakdown(timeline)
    mine = per_rank[per_rank["epoch"] == epoch]
    if layout is None or mine.empty:
        return ""
    share = {c: float((mine[c] / mine["span"]).mean()) for c in CLASSES}
    bubble = 1.0 - share["compute"]
    stretch = layout.bubble_stretch
    parts = " + ".join(f"{c} {share[c]:.1%}" for c in CLASSES)
    return (f"Epoch {epoch}, the ranks' mean shares of its training span: {parts} = 100%. "
            f"**Bubble** = 1 − compute = communication + waiting + idle = "
            f"**{bubble:.1%}** (the timeline's title). **Efficiency** = (1 − bubble) × "
            f"(C′+S−1)/C′ = {1 - bubble:.3f} × {stretch:.3f} = **{(1 - bubble) * stretch:.1%}** "
            f"(the Ranks card; C′ = {layout.chunks / layout.ways:g} chunks per way, "
            f"S = {layout.stages}). The Ranks card's table gives medians over epochs, so it "
            "matches this epoch only roughly.")


def memory_table(memory: pd.DataFrame) -> str:
    """Markdown: per rank, the peak memory its run added to its process (``Run.memory()``)."""
    if memory.empty:
        return "Peak memory: none reported yet."
    rows = "".join(f"| {int(r.rank)} | {_size(int(r.peak_bytes))} |\n"
                   for r in memory.itertuples())
    trims = memory["heap_trims"] if "heap_trims" in memory else pd.Series(dtype="int64")
    near = ", ".join(f"rank {int(r)} {int(t)}×" for r, t in zip(memory["rank"], trims) if t)
    return ("| rank | peak memory |\n|---|---:|\n" + rows
            + "\nwhat each rank's run added to its process's resident memory at its highest"
            + (f"; near their memory limits ranks trimmed their heaps ({near}), at a cost in "
               "time" if near else ""))


def _size(n: int) -> str:
    """Bytes as MiB below 1 GiB, else GiB."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"
