"""Plan view: every layout a plan weighed (``gp.plan``), its predicted epoch against its
predicted peak memory per rank, the chosen one marked and, once the run has measured them, the
running layout's measured epoch and peak beside its prediction (``run.prediction``,
:class:`gnnpipe.core.prediction.Prediction`)."""

from __future__ import annotations

import math
from typing import Any

import holoviews as hv
import holoviews.plotting.bokeh  # registers the bokeh options used below
import pandas as pd
import panel as pn

from dashboard.style import MODE_COLORS, MODE_MARKERS, OTHER_COLOR, human_bytes
from gnnpipe.core.prediction import Prediction

__all__ = ["MEASURED_COLOR", "PLAN_HEIGHT", "PLAN_TITLE", "PLAN_WIDTH", "PLOT_COLUMNS",
           "candidate_frame", "measured_figures", "plan_panel", "plan_plot", "plan_text"]

#: The plot's fixed size in pixels (fits a 1,000-px notebook cell, like the stage timelines).
PLAN_WIDTH, PLAN_HEIGHT = 760, 380
#: The plot's title.
PLAN_TITLE = "plan: predicted epoch against peak memory per rank"
#: Colour of the measured point and of the line joining it to its prediction.
MEASURED_COLOR = "#222222"
#: Bytes per unit of the x axis (MiB).
_MIB = 2**20
#: Modes in the order the legend lists them.
_MODES = ("single", "local", "pipeline", "graph", "hybrid")

_X = hv.Dimension("peak_mib", label="peak memory per rank", unit="MiB")
_Y = hv.Dimension("epoch_time", label="epoch", unit="s")
#: Columns of every point the plot draws (:func:`candidate_frame`): the axes, then what the
#: hover shows.
PLOT_COLUMNS = ("peak_mib", "epoch_time", "layout", "mode", "peak", "comm", "reason", "color",
                "marker")
_TOOLTIPS = [("layout", "@layout"), ("mode", "@mode"), ("epoch", "@{epoch_time}{0.[0000]}"),
             ("peak per rank", "@peak"), ("bytes per epoch", "@comm"), ("", "@reason")]


def candidate_frame(prediction: Prediction) -> pd.DataFrame:
    """One row per candidate of ``prediction`` (its ``candidates`` table) with the columns
    :func:`plan_plot` draws: :data:`PLOT_COLUMNS`, then ``peak_bytes``, ``comm_bytes``,
    ``fits`` and ``chosen``. ``peak_mib`` is the candidate's largest rank's predicted peak in
    MiB (2^20 bytes)."""
    raw = prediction.candidates
    if raw.empty:
        return pd.DataFrame(columns=[*PLOT_COLUMNS, "peak_bytes", "comm_bytes", "fits",
                                     "chosen"])
    df = pd.DataFrame({
        "layout": raw["layout"].astype(str),
        "mode": raw["mode"].astype(str),
        "epoch_time": raw["epoch_time"].astype("float64"),
        "peak_bytes": raw["peak_bytes"].astype("int64"),
        "comm_bytes": raw["comm_bytes"].astype("int64"),
        "fits": raw["fits"].fillna(True).astype(bool),
        "chosen": raw["chosen"].fillna(False).astype(bool),
        "reason": raw["reason"].fillna("").astype(str),
    }).reset_index(drop=True)
    df["peak_mib"] = df["peak_bytes"] / _MIB
    df["peak"] = df["peak_bytes"].map(human_bytes)
    df["comm"] = df["comm_bytes"].map(human_bytes)
    df["color"] = df["mode"].map(MODE_COLORS).fillna(OTHER_COLOR).astype(object)
    df["marker"] = df["mode"].map(MODE_MARKERS).fillna("circle").astype(object)
    return df.loc[:, [*PLOT_COLUMNS, "peak_bytes", "comm_bytes", "fits", "chosen"]]


def measured_figures(history: pd.DataFrame,
                     memory: pd.DataFrame) -> tuple[float | None, int | None, float | None]:
    """``(epoch seconds, peak bytes, bytes per epoch)`` a run measured so far: the median epoch
    time after the first epoch (the first alone while it is the only one), the largest rank's
    peak memory (``run.memory()``) and the median bytes per epoch; ``None`` for what it has not
    measured yet."""
    epoch = comm = None
    if "epoch_time" in history.columns:
        times = history["epoch_time"].dropna().astype("float64")
        if len(times) > 1:
            times = times.iloc[1:]
        epoch = float(times.median()) if len(times) else None
    if "comm_bytes" in history.columns:
        sent = history["comm_bytes"].dropna().astype("float64")
        sent = sent.iloc[1:] if len(sent) > 1 else sent
        comm = float(sent.median()) if len(sent) else None
    peaks = memory["peak_bytes"] if "peak_bytes" in memory.columns else pd.Series(dtype="int64")
    peak = int(peaks.max()) if len(peaks) and int(peaks.max()) > 0 else None
    return epoch, peak, comm


def _points(rows: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=list(PLOT_COLUMNS))


def _scatter(df: pd.DataFrame, group: str, label: str = "") -> hv.Scatter:
    return hv.Scatter(df.loc[:, list(PLOT_COLUMNS)], kdims=[_X],
                      vdims=[_Y, *PLOT_COLUMNS[2:]], group=group, label=label)


def _align(x: float, xs: list[float]) -> str:
    """Write a label at ``x`` leftwards when ``x`` lies right of the drawn points' middle."""
    middle = (min(xs) + max(xs)) / 2 if xs else x
    return "right" if x > middle and max(xs) > min(xs) else "left"


def _top(values: list[float]) -> float:
    """An axis end a little past the largest value (axes start at zero)."""
    top = max((v for v in values if not math.isnan(v)), default=0.0)
    return top * 1.12 if top > 0 else 1.0


def _label(x: float | None, y: float | None, text: str, align: str = "left",
           above: bool = True, lift: float = 0.0) -> hv.Labels:
    """``text`` beside the point ``(x, y)``, ``lift`` (data units) above or below it."""
    rows = [(x, y, f"\u2002{text}\u2002")] if x is not None and y is not None else []
    return hv.Labels(pd.DataFrame(rows, columns=["peak_mib", "epoch_time", "text"]),
                     kdims=[_X, _Y], vdims=["text"], group="Labels").opts(
        text_align=align, text_baseline="bottom" if above else "top",
        yoffset=lift if above else -lift, text_font_size="9pt", text_color="#333333",
        backend="bokeh")


def plan_plot(prediction: Prediction, measured_epoch: float | None = None,
              measured_peak: int | None = None, measured_comm: float | None = None) -> hv.Overlay:
    """Every candidate of ``prediction``: x its predicted peak memory per rank (its largest
    rank's, in MiB), y its predicted epoch seconds.

    Element groups, in overlay order: ``Candidates`` (one ``hv.Scatter`` per mode among the
    candidates that fit the memory limit, filled, coloured and shaped by mode,
    :data:`dashboard.style.MODE_COLORS` / ``MODE_MARKERS``); ``Unfit`` (the candidates that do not
    fit, hollow, outlined in their mode's colour; only when there are some); ``Chosen`` (the
    chosen layout, ``prediction``'s own figures, a large star); ``Gap`` (an ``hv.Segments`` from
    the chosen prediction to the measured point); ``Measured`` (the running layout's measured
    epoch and largest rank's peak, a black diamond); ``Limit`` (a dotted vertical line at the
    memory limit the plan was made under, if any); and ``Labels`` naming the chosen and the
    measured points. ``Gap``, ``Measured`` and the measured label are empty until both
    ``measured_epoch`` and ``measured_peak`` are known, so a live plot keeps its layers.
    Hovering a point gives its layout, mode, epoch, peak, bytes per epoch and the planner's
    reason.
    """
    df = candidate_frame(prediction)
    chosen_x = max(prediction.peak_bytes, default=0) / _MIB
    chosen_y = float(prediction.epoch_time)
    mode = next(iter(df.loc[df["chosen"], "mode"]), str(prediction.layout).split(" ")[0])
    chosen_reason = next(iter(df.loc[df["chosen"], "reason"]), "chosen")
    chosen = _points([{"peak_mib": chosen_x, "epoch_time": chosen_y,
                       "layout": prediction.layout, "mode": mode,
                       "peak": human_bytes(chosen_x * _MIB),
                       "comm": human_bytes(prediction.comm_bytes), "reason": chosen_reason,
                       "color": MODE_COLORS.get(mode, OTHER_COLOR),
                       "marker": MODE_MARKERS.get(mode, "circle")}])
    mx: float | None = None
    my: float | None = None
    if measured_epoch is not None and measured_peak is not None:
        mx, my = measured_peak / _MIB, float(measured_epoch)
    measured_rows = [] if mx is None else [{
        "peak_mib": mx, "epoch_time": my, "layout": f"{prediction.layout} (measured)",
        "mode": mode, "peak": human_bytes(mx * _MIB),
        "comm": "—" if measured_comm is None else human_bytes(measured_comm),
        "reason": "measured: median epoch after the first, the largest rank's peak",
        "color": MEASURED_COLOR, "marker": "diamond"}]

    layers: list[Any] = []
    fits = df[df["fits"]]
    for name in sorted(set(fits["mode"]), key=lambda m: (_MODES.index(m) if m in _MODES
                                                         else len(_MODES), m)):
        group = fits[fits["mode"] == name]
        layers.append(_scatter(group, "Candidates", name).opts(
            color=MODE_COLORS.get(name, OTHER_COLOR), marker=MODE_MARKERS.get(name, "circle"),
            size=9, alpha=0.85, line_color="white", tools=["hover"], hover_tooltips=_TOOLTIPS,
            backend="bokeh"))
    unfit = df[~df["fits"]]
    if len(unfit):
        layers.append(_scatter(unfit, "Unfit", "does not fit").opts(
            marker="marker", line_color="color", fill_alpha=0.0, line_alpha=0.7, line_width=1.5,
            size=9, tools=["hover"], hover_tooltips=_TOOLTIPS, backend="bokeh"))
    layers.append(_scatter(chosen, "Chosen", "chosen").opts(
        marker="star", size=20, color=MODE_COLORS.get(mode, OTHER_COLOR), line_color="black",
        line_width=1.5, tools=["hover"], hover_tooltips=_TOOLTIPS, backend="bokeh"))
    segment = [(chosen_x, chosen_y, mx, my)] if mx is not None else []
    layers.append(hv.Segments(pd.DataFrame(segment, columns=["peak_mib", "epoch_time",
                                                             "peak_mib_end", "epoch_end"]),
                              kdims=[_X, _Y, "peak_mib_end", "epoch_end"], group="Gap").opts(
        color=MEASURED_COLOR, line_dash="dashed", line_width=1.5, backend="bokeh"))
    layers.append(_scatter(_points(measured_rows), "Measured", "measured").opts(
        marker="diamond", size=14, color=MEASURED_COLOR, line_color="white", tools=["hover"],
        hover_tooltips=_TOOLTIPS, backend="bokeh"))
    limit = prediction.memory_limit
    if limit is not None:  # the memory limit the plan was made under, where the axis reaches
        layers.append(hv.VLine(limit / _MIB, group="Limit").opts(
            color=OTHER_COLOR, line_dash="dotted", line_width=1.5, backend="bokeh"))
    # each label on the far side of its point from the other point (off the line joining
    # them), and leftwards in the right half of the plot (inside it)
    xs = [*df["peak_mib"].tolist(), chosen_x, *([mx] if mx is not None else []),
          *([limit / _MIB] if limit is not None else [])]
    ys = [*df["epoch_time"].tolist(), chosen_y, *([my] if my is not None else [])]
    lift = 0.03 * max(ys)
    chosen_above = my is None or chosen_y >= my
    layers.append(_label(chosen_x, chosen_y, prediction.layout, _align(chosen_x, xs),
                         chosen_above, lift))
    layers.append(_label(mx, my, "measured", _align(mx, xs) if mx is not None else "left",
                         not chosen_above, lift))
    return hv.Overlay(layers).opts(
        title=PLAN_TITLE, responsive=False, width=PLAN_WIDTH, height=PLAN_HEIGHT,
        xlim=(0, _top(xs)), ylim=(0, _top(ys)), legend_position="right",
        show_grid=True, backend="bokeh")


def _ratio(measured: float | None, predicted: float) -> str:
    if measured is None:
        return "not measured yet"
    if predicted <= 0:
        return "no prediction to compare"
    return f"**{measured / predicted:.2f}×** predicted"


def plan_text(prediction: Prediction, measured_epoch: float | None = None,
              measured_peak: int | None = None) -> str:
    """Markdown: the chosen layout among how many candidates, and its predicted epoch and peak
    per rank beside the measured ones (measured ÷ predicted)."""
    df = candidate_frame(prediction)
    peak = max(prediction.peak_bytes, default=0)
    weighed = (f" of {len(df)} candidates ({int(df['fits'].sum())} fit the memory limit)"
               if len(df) else "")
    epoch = ("—" if measured_epoch is None else f"{measured_epoch:.4g} s")
    measured = "—" if measured_peak is None else human_bytes(measured_peak)
    return (f"Chosen layout **{prediction.layout}**{weighed}.  \n"
            f"Epoch: predicted {prediction.epoch_time:.4g} s, measured {epoch} (median after "
            f"the first epoch): {_ratio(measured_epoch, prediction.epoch_time)}.  \n"
            f"Peak memory per rank: predicted {human_bytes(peak)} (largest rank), measured "
            f"{measured} (largest rank's, `run.memory()`): {_ratio(measured_peak, peak)}.  \n"
            f"Predicted bytes per epoch: {human_bytes(prediction.comm_bytes)}.")


def plan_panel(prediction: Prediction, measured_epoch: float | None = None,
               measured_peak: int | None = None,
               measured_comm: float | None = None) -> pn.viewable.Viewable:
    """:func:`plan_plot` above :func:`plan_text` (a static card; the dashboard streams the
    plot's measured point as epochs arrive)."""
    return pn.Column(
        pn.pane.HoloViews(plan_plot(prediction, measured_epoch, measured_peak, measured_comm),
                          linked_axes=False, width=PLAN_WIDTH + 20),
        pn.pane.Markdown(plan_text(prediction, measured_epoch, measured_peak),
                         width=PLAN_WIDTH),
    )
