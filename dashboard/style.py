"""One visual language for every view: the op-kind colours (timeline lanes, rank shares), the
byte-counter colours, their legends, and byte counts written as B / KiB / MiB / GiB."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from gnnpipe.core.timeline import KINDS

__all__ = ["CLASS_COLORS", "COMM_KIND_COLORS", "LEGEND_NAME", "MODE_COLORS", "MODE_MARKERS",
           "OP_COLORS", "OP_LABELS", "OTHER_COLOR", "bytes_axis", "bytes_formatter", "categorical_ticks", "human_bytes",
           "legend_hook", "op_color", "op_legend", "percent_axis"]

#: Colour per op kind (``gnnpipe.core.timeline.KINDS``). ``idle`` is the lane background: gaps between
#: bars are idle time.
OP_COLORS: dict[str, str] = {
    "forward": "#4c78a8",
    "backward": "#f58518",
    "weight": "#ffbf79",
    "send": "#54a24b",
    "recv": "#b7dfa8",
    "allreduce": "#b279a2",
    "step": "#e45756",
    "idle": "#ececec",
}
#: Legend label per op kind where it says more than the kind.
OP_LABELS: dict[str, str] = {"weight": "weight grad", "recv": "recv (waiting)",
                             "idle": "idle (gap)"}
#: Colour per class of a rank's time (``gnnpipe.analysis.efficiency.CLASSES``), taken from the op kinds
#: that make it up: compute is forward's, communication send's, waiting recv's, idle idle's.
CLASS_COLORS: dict[str, str] = {"compute": OP_COLORS["forward"],
                                "communication": OP_COLORS["send"],
                                "waiting": OP_COLORS["recv"], "idle": OP_COLORS["idle"]}
#: Colour per byte counter of ``Run.comm`` (``gnnpipe/runtime/comm.py``): activations and their
#: gradients in forward/backward hues, halo and boundary exchanges in greens and teals.
COMM_KIND_COLORS: dict[str, str] = {
    "activation": "#4c78a8",
    "gradient": "#f58518",
    "halo": "#54a24b",
    "halo_grad": "#a0d48e",
    "boundary": "#2a9d8f",
    "boundary_grad": "#8fd3cb",
    "eval": "#eeca3b",
    "allreduce": "#b279a2",
    "control": "#9d755d",
}
#: Colour per training mode (``gnnpipe.core.kinds.Mode``), for the plan card's candidates.
MODE_COLORS: dict[str, str] = {
    "single": "#9d755d",
    "local": "#f58518",
    "pipeline": "#4c78a8",
    "graph": "#54a24b",
    "hybrid": "#b279a2",
}
#: Bokeh marker per training mode, so modes stay apart without colour too.
MODE_MARKERS: dict[str, str] = {
    "single": "square",
    "local": "diamond",
    "pipeline": "circle",
    "graph": "triangle",
    "hybrid": "inverted_triangle",
}
#: Colour of anything not in the tables above.
OTHER_COLOR = "#7f7f7f"

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
#: Bokeh tick formatter code: ``tick`` (bytes) as ``1.5 MiB``.
_BYTES_JS = """
const units = ["B", "KiB", "MiB", "GiB", "TiB"];
let v = Math.abs(tick), i = 0;
while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
const s = i === 0 ? v.toFixed(0) : (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2));
return (tick < 0 ? "-" : "") + s + " " + units[i];
"""


def op_color(kind: str) -> str:
    return OP_COLORS.get(kind, OTHER_COLOR)


def human_bytes(nbytes: float) -> str:
    """``1536`` → ``"1.5 KiB"``; ``-2048`` → ``"-2.0 KiB"``."""
    value, unit = abs(float(nbytes)), 0
    while value >= 1024 and unit < len(_UNITS) - 1:
        value /= 1024
        unit += 1
    sign = "-" if nbytes < 0 else ""
    return f"{sign}{value:.0f} B" if unit == 0 else f"{sign}{value:.1f} {_UNITS[unit]}"


def bytes_formatter() -> Any:
    """A fresh bokeh tick formatter writing bytes in B/KiB/MiB/GiB (one per plot: a bokeh
    model belongs to one document)."""
    from bokeh.models import CustomJSTickFormatter

    return CustomJSTickFormatter(code=_BYTES_JS)


def bytes_axis(axis: str = "y") -> Callable[[Any, Any], None]:
    """A HoloViews hook putting :func:`bytes_formatter` on the ``axis`` (``x``, ``y`` or
    ``colorbar``) of the rendered plot."""

    def hook(plot: Any, element: Any) -> None:
        if axis == "colorbar":
            colorbar = plot.handles.get("colorbar")
            if colorbar is not None:
                colorbar.formatter = bytes_formatter()
            return
        for ax in getattr(plot.state, f"{axis}axis"):
            ax.formatter = bytes_formatter()

    return hook


def percent_axis(axis: str = "y") -> Callable[[Any, Any], None]:
    """A HoloViews hook writing the ``axis`` ticks (shares, 0–1) as percentages."""

    def hook(plot: Any, element: Any) -> None:
        from bokeh.models import NumeralTickFormatter

        for ax in getattr(plot.state, f"{axis}axis"):
            ax.formatter = NumeralTickFormatter(format="0%")

    return hook


#: Name of the legend :func:`legend_hook` adds (it adds one per plot, however often it runs).
LEGEND_NAME = "gnnpipe-legend"


def legend_hook(items: Iterable[tuple[str, str]], title: str | None = None,
                ncols: int = 1) -> Callable[[Any, Any], None]:
    """A HoloViews hook adding a legend right of the plot (``ncols`` columns) with one colour
    square per ``(label, colour)``, whatever the plot's data holds (the scheme is shown)."""
    items = list(items)

    def hook(plot: Any, element: Any) -> None:
        from bokeh.models import ColumnDataSource, LinearScale, Range1d, Scatter
        from bokeh.models.annotations import Legend, LegendItem  # bokeh.models' types lack them

        fig = plot.state
        if any(getattr(r, "name", None) == LEGEND_NAME for r in fig.right):
            return  # a streamed plot runs its hooks on every update: one legend is enough
        # one undrawable point per item on ranges of its own (the plot's may be categorical):
        # the legend draws its glyph, the plot draws nothing
        fig.extra_x_ranges = {**fig.extra_x_ranges, "legend": Range1d(start=0, end=1)}
        fig.extra_y_ranges = {**fig.extra_y_ranges, "legend": Range1d(start=0, end=1)}
        fig.extra_x_scales = {**fig.extra_x_scales, "legend": LinearScale()}
        fig.extra_y_scales = {**fig.extra_y_scales, "legend": LinearScale()}
        entries = []
        for label, color in items:
            glyph = Scatter(x="x", y="y", marker="square", size=10, fill_color=color,
                            line_color="#999999")
            source = ColumnDataSource({"x": [float("nan")], "y": [float("nan")]})
            renderer = fig.add_glyph(source, glyph, x_range_name="legend",
                                     y_range_name="legend")
            entries.append(LegendItem(label=label, renderers=[renderer]))
        legend = Legend(items=entries, location="top_left", click_policy="none", ncols=ncols,
                        label_text_font_size="8pt", label_height=12, glyph_height=12,
                        # bokeh's stub types padding as Property[Property[int] | ...], not int
                        padding=2,  # type: ignore[arg-type]
                        spacing=2, margin=4, border_line_alpha=0, title=title,
                        title_text_font_size="8pt", name=LEGEND_NAME)
        fig.add_layout(legend, "right")

    return hook


def op_legend(kinds: Iterable[str] = KINDS) -> list[tuple[str, str]]:
    """``(label, colour)`` of each op kind of the scheme, in :data:`gnnpipe.core.timeline.KINDS` order."""
    return [(OP_LABELS.get(k, k), op_color(k)) for k in kinds]


def categorical_ticks(count: int) -> dict[str, Any]:
    """Plot options that keep ``count`` category labels from overlapping."""
    if count <= 12:
        return {}
    return {"xrotation": 90, "fontsize": {"xticks": "7pt" if count <= 48 else "5pt"}}
