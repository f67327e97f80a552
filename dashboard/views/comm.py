"""Communication views: rank-to-rank bytes, bytes per counter kind, and bytes per epoch measured
against the formula (both series, and their difference). Byte axes read B/KiB/MiB/GiB."""

from __future__ import annotations

import holoviews as hv
import holoviews.plotting.bokeh  # registers the bokeh options used below
import numpy as np
import pandas as pd

from dashboard.style import (
    COMM_KIND_COLORS,
    OTHER_COLOR,
    bytes_axis,
    categorical_ticks,
    human_bytes,
)

__all__ = ["ALL_LABEL", "NO_BYTES_LABEL", "bytes_by_kind_plot", "bytes_difference_plot",
           "bytes_per_epoch_plot", "comm_matrix_frame", "comm_matrix_plot"]

#: Column label of collective traffic (``dst == -1``: all-reduce, eval and control
#: reductions) in :func:`comm_matrix_plot`.
ALL_LABEL = "all"
_COMM_COLUMNS = ["src", "dst", "kind", "bytes"]


#: The one bar of a bytes-by-kind plot before anything was counted.
NO_BYTES_LABEL = "none yet"


def _clean(comm: pd.DataFrame) -> pd.DataFrame:
    """``comm`` with int ``src``/``dst``/``bytes`` and str ``kind`` (empty frames too)."""
    df = comm.loc[:, _COMM_COLUMNS] if len(comm) else pd.DataFrame(columns=_COMM_COLUMNS)
    return df.astype({"src": "int64", "dst": "int64", "kind": "object", "bytes": "int64"})


def _rank_label(rank: int) -> str:
    return ALL_LABEL if rank < 0 else str(rank)


def comm_matrix_frame(comm: pd.DataFrame, ranks: int = 0) -> pd.DataFrame:
    """Bytes per ``(src, dst)`` summed over kinds, as the rows :func:`comm_matrix_plot` draws.

    Columns ``src``, ``dst`` (str labels; ``dst == -1`` becomes :data:`ALL_LABEL`), ``bytes``.
    Every (src, dst) pair of the ranks seen and of ranks ``0 … ranks − 1`` appears, zeros
    included; the ``all`` column only when collectives were counted.
    """
    df = _clean(comm)
    totals = df.groupby(["src", "dst"])["bytes"].sum()
    seen = sorted({int(r) for r in pd.concat([df["src"], df["dst"]]) if r >= 0} | set(range(ranks)))
    dsts = seen + ([-1] if (df["dst"] < 0).any() else [])
    index = pd.MultiIndex.from_product([seen, dsts], names=["src", "dst"])
    full = totals.reindex(index, fill_value=0).reset_index()
    full["src"] = full["src"].map(_rank_label)
    full["dst"] = full["dst"].map(_rank_label)
    return full


def comm_matrix_plot(comm: pd.DataFrame, ranks: int = 0) -> hv.HeatMap:
    """Heatmap of bytes sent from rank ``src`` (rows) to rank ``dst`` (columns).

    Kinds are summed. Collectives (``dst == -1`` in ``Run.comm``: the weight all-reduce,
    evaluation and control reductions) have no single destination: they are shown as one
    extra column labelled :data:`ALL_LABEL`, holding the bytes each rank contributed.

    Args:
        comm: ``Run.comm``: columns ``src``, ``dst``, ``kind``, ``bytes``.
        ranks: rows and columns for at least this many ranks (a live run's, before it sent).

    Returns:
        ``hv.HeatMap`` with kdims ``(dst, src)`` (str labels, ranks in numeric order and
        ``all`` last) and vdim ``bytes`` (see :func:`comm_matrix_frame`).
    """
    df = comm_matrix_frame(comm, ranks)
    order = list(dict.fromkeys(df["dst"]))
    srcs = list(dict.fromkeys(df["src"]))
    kdims = [hv.Dimension("dst", label="destination rank", values=order),
             hv.Dimension("src", label="source rank", values=srcs)]
    total = int(df["bytes"].sum())
    return hv.HeatMap(df, kdims=kdims, vdims=["bytes"]).opts(
        cmap="Blues", colorbar=True, tools=["hover"], invert_yaxis=True,
        hooks=[bytes_axis("colorbar")], hover_tooltips=[("src", "@src"), ("dst", "@dst"),
                                                         ("bytes", "@bytes{0,0}")],
        title=f"bytes rank → rank (total {human_bytes(total)})", responsive=True, height=320,
        backend="bokeh",
    )


def bytes_by_kind_plot(comm: pd.DataFrame) -> hv.Bars:
    """Bars of bytes per counter kind (``Run.comm``'s ``kind``: activation, gradient, halo,
    halo_grad, boundary, boundary_grad, eval, allreduce, control), summed over ranks, largest
    first, coloured by :data:`dashboard.style.COMM_KIND_COLORS`.

    Returns:
        ``hv.Bars`` with kdim ``kind`` and vdims ``bytes``, ``color``; before any bytes, one
        bar of :data:`NO_BYTES_LABEL` (a categorical axis from the start, for streaming).
    """
    df = _clean(comm).groupby("kind", as_index=False)["bytes"].sum()
    if df.empty:
        df = pd.DataFrame({"kind": [NO_BYTES_LABEL], "bytes": [0]})
    df = df.sort_values(["bytes", "kind"], ascending=[False, True], ignore_index=True)
    df["color"] = df["kind"].map(COMM_KIND_COLORS).fillna(OTHER_COLOR).astype(object)
    total = human_bytes(df["bytes"].sum())
    return hv.Bars(df, kdims=["kind"], vdims=["bytes", "color"]).opts(
        color="color", tools=["hover"], title=f"bytes by kind (total {total})", ylabel="",
        xlabel="", xrotation=30, hooks=[bytes_axis("y")], responsive=True, height=320,
        backend="bokeh", **categorical_ticks(len(df)),
    )


def _epoch_bytes(history: pd.DataFrame) -> pd.DataFrame:
    return history.loc[:, ["epoch", "comm_bytes"]].astype({"epoch": "int64",
                                                          "comm_bytes": "float64"})


def bytes_per_epoch_plot(history: pd.DataFrame, predicted: float | None = None) -> hv.Overlay:
    """Measured bytes per epoch (``history.comm_bytes``) and the formula's, as two series on
    an axis from 0 (so a steady count is a flat line, not noise magnified).

    Args:
        history: ``Run.history`` (columns ``epoch`` and ``comm_bytes`` are used).
        predicted: Bytes per epoch by the formula (``gp.comm_volume``), drawn as a dashed
            series over the same epochs; ``None`` for none.

    Returns:
        An ``hv.Overlay`` of ``hv.Curve`` ``measured`` (kdim ``epoch``, vdim ``comm_bytes``)
        and, with ``predicted``, ``hv.Curve`` ``formula``; the title gives the medians.
    """
    df = _epoch_bytes(history)
    measured = hv.Curve(df, kdims=["epoch"], vdims=[hv.Dimension("comm_bytes", label="bytes")],
                        label="measured").opts(color="#4c78a8", line_width=2, tools=["hover"],
                                               backend="bokeh")
    items: list[hv.Element] = [measured]
    top = float(df["comm_bytes"].max()) if len(df) else 0.0
    title = "bytes/epoch"
    if len(df):
        title += f": {human_bytes(df['comm_bytes'].median())}"
    if predicted is not None:
        formula = df.assign(comm_bytes=float(predicted))
        items.append(hv.Curve(formula, kdims=["epoch"],
                              vdims=[hv.Dimension("comm_bytes", label="bytes")],
                              label="formula").opts(color="#e45756", line_dash="dashed",
                                                    line_width=2, backend="bokeh"))
        title += f" (formula {human_bytes(predicted)})"
        top = max(top, float(predicted))
    return hv.Overlay(items).opts(
        title=title, ylim=(0, top * 1.15 or 1.0), legend_position="bottom_right",
        hooks=[bytes_axis("y")], responsive=True, height=320, backend="bokeh")


def bytes_difference_plot(history: pd.DataFrame, predicted: float | None = None) -> hv.Curve:
    """Measured minus formula bytes per epoch, on an axis symmetric about 0 spanning at least
    ±1% of the formula (an exact match is a flat line at 0, not a magnified rounding error).

    Returns:
        ``hv.Curve`` with kdim ``epoch`` and vdim ``difference`` (bytes); empty without a
        formula. The title gives the median difference and its share of the formula.
    """
    df = _epoch_bytes(history)
    if predicted is None:
        df = df.iloc[:0]
    diff = pd.DataFrame({"epoch": df["epoch"], "difference": df["comm_bytes"] - (predicted or 0)})
    reach = max(float(np.abs(diff["difference"]).max()) if len(diff) else 0.0,
                0.01 * float(predicted or 0), 1.0) * 1.2
    title = "measured − formula"
    if len(diff) and predicted:
        median = float(diff["difference"].median())
        title += f": {human_bytes(median)} ({median / predicted:+.2%})"
    elif predicted is None:
        title += ": no formula"
    return hv.Curve(diff, kdims=["epoch"], vdims=[hv.Dimension("difference", label="bytes")],
                    label="difference").opts(
        color="#b279a2", line_width=2, tools=["hover"], title=title, ylim=(-reach, reach),
        hooks=[bytes_axis("y")], responsive=True, height=320, backend="bokeh")
