"""Communication views: rank-to-rank bytes, bytes per kind, bytes per epoch vs the formula."""

from __future__ import annotations

import holoviews as hv
import holoviews.plotting.bokeh  # registers the bokeh options used below
import pandas as pd

#: Column label of collective traffic (``dst == -1``: all-reduce, eval and control
#: reductions) in :func:`comm_matrix_plot`.
ALL_LABEL = "all"
#: Bar colour per communication kind; kinds not listed get :data:`OTHER_COLOR`.
COMM_KIND_COLORS: dict[str, str] = {
    "activation": "#4c78a8",
    "gradient": "#f58518",
    "halo": "#54a24b",
    "halo_grad": "#88d27a",
    "boundary": "#72b7b2",
    "boundary_grad": "#9ecae9",
    "allreduce": "#b279a2",
    "eval": "#eeca3b",
    "control": "#9d755d",
}
OTHER_COLOR = "#7f7f7f"
_COMM_COLUMNS = ["src", "dst", "kind", "bytes"]


def _clean(comm: pd.DataFrame) -> pd.DataFrame:
    """``comm`` with int ``src``/``dst``/``bytes`` and str ``kind`` (empty frames too)."""
    df = comm.loc[:, _COMM_COLUMNS] if len(comm) else pd.DataFrame(columns=_COMM_COLUMNS)
    return df.astype({"src": "int64", "dst": "int64", "kind": "object", "bytes": "int64"})


def _rank_label(rank: int) -> str:
    return ALL_LABEL if rank < 0 else str(rank)


def comm_matrix_frame(comm: pd.DataFrame) -> pd.DataFrame:
    """Bytes per ``(src, dst)`` summed over kinds, as the rows :func:`comm_matrix_plot` draws.

    Columns ``src``, ``dst`` (str labels; ``dst == -1`` becomes :data:`ALL_LABEL`), ``bytes``.
    Every (src, dst) pair of the ranks seen appears, zeros included; the ``all`` column only
    when collectives were counted.
    """
    df = _clean(comm)
    totals = df.groupby(["src", "dst"])["bytes"].sum()
    ranks = sorted({int(r) for r in pd.concat([df["src"], df["dst"]]) if r >= 0})
    dsts = ranks + ([-1] if (df["dst"] < 0).any() else [])
    index = pd.MultiIndex.from_product([ranks, dsts], names=["src", "dst"])
    full = totals.reindex(index, fill_value=0).reset_index()
    full["src"] = full["src"].map(_rank_label)
    full["dst"] = full["dst"].map(_rank_label)
    return full


def comm_matrix_plot(comm: pd.DataFrame) -> hv.HeatMap:
    """Heatmap of bytes sent from rank ``src`` (rows) to rank ``dst`` (columns).

    Kinds are summed. Collectives (``dst == -1`` in ``Run.comm``: the weight all-reduce,
    evaluation and control reductions) have no single destination: they are shown as one
    extra column labelled :data:`ALL_LABEL`, holding the bytes each rank contributed.

    Args:
        comm: ``Run.comm``: columns ``src``, ``dst``, ``kind``, ``bytes``.

    Returns:
        ``hv.HeatMap`` with kdims ``(dst, src)`` (str labels, ranks in numeric order and
        ``all`` last) and vdim ``bytes`` (see :func:`comm_matrix_frame`).
    """
    df = comm_matrix_frame(comm)
    order = list(dict.fromkeys(df["dst"]))
    srcs = list(dict.fromkeys(df["src"]))
    kdims = [hv.Dimension("dst", label="destination rank", values=order),
             hv.Dimension("src", label="source rank", values=srcs)]
    total = int(df["bytes"].sum())
    return hv.HeatMap(df, kdims=kdims, vdims=["bytes"]).opts(
        cmap="Blues", colorbar=True, tools=["hover"], invert_yaxis=True,
        title=f"bytes rank → rank (total {_human(total)})", responsive=True, height=320,
        backend="bokeh",
    )


def bytes_by_kind_plot(comm: pd.DataFrame) -> hv.Bars:
    """Bars of bytes per communication kind (summed over ranks), largest first.

    Returns:
        ``hv.Bars`` with kdim ``kind`` and vdims ``bytes``, ``color``.
    """
    df = _clean(comm).groupby("kind", as_index=False)["bytes"].sum()
    df = df.sort_values(["bytes", "kind"], ascending=[False, True], ignore_index=True)
    df["color"] = df["kind"].map(COMM_KIND_COLORS).fillna(OTHER_COLOR).astype(object)
    return hv.Bars(df, kdims=["kind"], vdims=["bytes", "color"]).opts(
        color="color", tools=["hover"], title="bytes by kind", ylabel="bytes",
        responsive=True, height=300, backend="bokeh",
    )


def bytes_per_epoch_plot(history: pd.DataFrame, predicted: float | None = None) -> hv.Overlay:
    """Measured bytes per epoch (``history.comm_bytes``), with the formula's prediction.

    Args:
        history: ``Run.history`` (columns ``epoch`` and ``comm_bytes`` are used).
        predicted: Bytes per epoch by the formula (``gp.comm_volume``), drawn as a dashed
            horizontal line; ``None`` for none.

    Returns:
        An ``hv.Overlay`` of an ``hv.Curve`` (kdim ``epoch``, vdim ``comm_bytes``) and, when
        ``predicted`` is given, an ``hv.HLine``; the title gives the measured median and its
        ratio to the prediction.
    """
    df = history.loc[:, ["epoch", "comm_bytes"]].astype({"epoch": "int64", "comm_bytes": "float64"})
    curve = hv.Curve(df, kdims=["epoch"], vdims=[hv.Dimension("comm_bytes", label="bytes")],
                     label="measured").opts(color="#4c78a8", tools=["hover"], backend="bokeh")
    items: list[hv.Element] = [curve]
    title = "bytes per epoch"
    if len(df):
        title += f": median {_human(df['comm_bytes'].median())}"
    if predicted is not None:
        items.append(hv.HLine(float(predicted), label="formula").opts(
            color="#e45756", line_dash="dashed", backend="bokeh"))
        title += f", formula {_human(predicted)}"
        if len(df) and predicted > 0:
            title += f" (× {df['comm_bytes'].median() / predicted:.3f})"
    return hv.Overlay(items).opts(title=title, responsive=True, height=300, backend="bokeh")


def _human(nbytes: float) -> str:
    """``1536`` → ``"1.5 KiB"``."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"  # unreachable; keeps type checkers content
