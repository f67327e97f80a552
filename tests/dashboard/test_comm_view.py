"""Tests for dashboard.views.comm: rank-to-rank matrix, bytes by kind, bytes per epoch."""

from __future__ import annotations

import holoviews as hv
import numpy as np
import pandas as pd
import pytest

from dashboard.style import COMM_KIND_COLORS, OTHER_COLOR, human_bytes
from dashboard.views.comm import (
    ALL_LABEL,
    NO_BYTES_LABEL,
    bytes_by_kind_plot,
    bytes_difference_plot,
    bytes_per_epoch_plot,
    comm_matrix_frame,
    comm_matrix_plot,
)
from gnnpipe.runtime.comm import TRAINING_KINDS


@pytest.fixture
def comm() -> pd.DataFrame:
    rows = [
        (0, 1, "activation", 1000), (1, 2, "activation", 1000), (1, 0, "gradient", 800),
        (2, 1, "gradient", 800), (0, 1, "eval", 50), (0, -1, "allreduce", 40),
        (1, -1, "allreduce", 40), (2, -1, "allreduce", 40), (2, -1, "mystery", 5),
    ]
    return pd.DataFrame(rows, columns=["src", "dst", "kind", "bytes"])


def _cell(el: hv.HeatMap, src: str, dst: str) -> int:
    df = el.dframe()
    return int(df[(df["src"] == src) & (df["dst"] == dst)]["bytes"].sum())


def test_matrix_sums_kinds_and_keeps_collectives_in_all_column(comm) -> None:
    el = comm_matrix_plot(comm)
    assert isinstance(el, hv.HeatMap)
    assert [d.name for d in el.kdims] == ["dst", "src"]
    assert len(el) == 3 * 4  # 3 sources x (3 ranks + "all")
    assert el.dimension_values("bytes").sum() == comm["bytes"].sum()
    assert _cell(el, "0", "1") == 1050  # activation + eval
    assert _cell(el, "1", "0") == 800
    assert _cell(el, "0", "2") == 0
    assert _cell(el, "2", ALL_LABEL) == 45
    assert list(el.kdims[0].values) == ["0", "1", "2", ALL_LABEL]
    fig = hv.render(el, backend="bokeh")
    assert list(fig.x_range.factors) == ["0", "1", "2", ALL_LABEL]


def test_matrix_orders_ranks_numerically() -> None:
    comm = pd.DataFrame({"src": range(11), "dst": [(r + 1) % 11 for r in range(11)],
                         "kind": "activation", "bytes": 1})
    frame = comm_matrix_frame(comm)
    assert ALL_LABEL not in set(frame["dst"])  # no collectives, no "all" column
    assert list(dict.fromkeys(frame["dst"])) == [str(r) for r in range(11)]
    assert len(frame) == 121 and frame["bytes"].sum() == 11


def test_empty_comm_gives_empty_plots() -> None:
    empty = pd.DataFrame(columns=["src", "dst", "kind", "bytes"])
    assert len(comm_matrix_plot(empty)) == 0
    kinds = bytes_by_kind_plot(empty)  # one zero bar: a categorical axis from the start
    assert list(kinds.dimension_values("kind")) == [NO_BYTES_LABEL]
    assert kinds.dimension_values("bytes").sum() == 0
    hv.render(comm_matrix_plot(empty), backend="bokeh")
    hv.render(kinds, backend="bokeh")


def test_a_live_runs_matrix_has_every_rank_before_any_send() -> None:
    empty = pd.DataFrame(columns=["src", "dst", "kind", "bytes"])
    frame = comm_matrix_frame(empty, ranks=3)
    assert len(frame) == 9 and frame["bytes"].sum() == 0
    assert set(frame["src"]) == set(frame["dst"]) == {"0", "1", "2"}


def test_bytes_by_kind(comm) -> None:
    el = bytes_by_kind_plot(comm)
    assert isinstance(el, hv.Bars)
    df = el.dframe()
    assert list(df["kind"]) == ["activation", "gradient", "allreduce", "eval", "mystery"]
    assert list(df["bytes"]) == [2000, 1600, 120, 50, 5]
    assert list(df["color"]) == [COMM_KIND_COLORS[k] for k in df["kind"][:4]] + [OTHER_COLOR]
    hv.render(el, backend="bokeh")


def test_bytes_by_kind_splits_every_counter_kind() -> None:
    """One bar per counter kind of ``Run.comm``, each with its own colour, none grey."""
    kinds = [*TRAINING_KINDS, "eval", "allreduce", "control"]
    comm = pd.DataFrame({"src": 0, "dst": 1, "kind": kinds, "bytes": range(100, 100 + 9 * 10, 10)})
    comm = pd.concat([comm, comm.assign(src=1, dst=0)], ignore_index=True)
    df = bytes_by_kind_plot(comm).dframe()
    assert set(df["kind"]) == set(kinds) and len(df) == 9
    totals = comm.groupby("kind")["bytes"].sum()
    assert all(df.set_index("kind")["bytes"] == totals[df["kind"]].to_numpy())
    assert list(df["color"]) == [COMM_KIND_COLORS[k] for k in df["kind"]]
    assert OTHER_COLOR not in set(COMM_KIND_COLORS.values())
    assert len(set(COMM_KIND_COLORS.values())) == len(COMM_KIND_COLORS) == 9
    fig = hv.render(bytes_by_kind_plot(comm), backend="bokeh")
    assert type(fig.yaxis[0].formatter).__name__ == "CustomJSTickFormatter"  # KiB/MiB ticks
    assert fig.xaxis[0].major_label_orientation != "horizontal"


def test_human_bytes() -> None:
    assert human_bytes(0) == "0 B"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(153_601) == "150.0 KiB"
    assert human_bytes(3 * 1024**3) == "3.0 GiB"
    assert human_bytes(-2048) == "-2.0 KiB"


def test_bytes_per_epoch_with_formula() -> None:
    history = pd.DataFrame({"epoch": range(4), "comm_bytes": [100, 100, 110, 100]})
    el = bytes_per_epoch_plot(history, predicted=100)
    assert isinstance(el, hv.Overlay) and len(el) == 2
    curve, formula = el.Curve.Measured, el.Curve.Formula
    np.testing.assert_array_equal(curve.dimension_values("epoch"), [0, 1, 2, 3])
    np.testing.assert_array_equal(curve.dimension_values("comm_bytes"), [100, 100, 110, 100])
    np.testing.assert_array_equal(formula.dimension_values("comm_bytes"), [100] * 4)
    assert formula.opts.get().kwargs["line_dash"] == "dashed"
    assert el.opts.get().kwargs["ylim"][0] == 0  # a steady count is a flat line, not noise
    fig = hv.render(el, backend="bokeh")
    assert fig.title.text == "bytes/epoch: 100 B (formula 100 B)"


def test_difference_axis_is_sane_for_a_steady_count() -> None:
    """153,600 B every epoch against the same formula: a line at 0 on ±1% of the formula."""
    history = pd.DataFrame({"epoch": range(5), "comm_bytes": [153_600] * 5})
    el = bytes_difference_plot(history, predicted=153_600)
    np.testing.assert_array_equal(el.dimension_values("difference"), [0] * 5)
    low, high = el.opts.get().kwargs["ylim"]
    assert low == -high and high == pytest.approx(0.012 * 153_600)
    assert "+0.00%" in hv.render(el, backend="bokeh").title.text
    off = bytes_difference_plot(history.assign(comm_bytes=[160_000] * 5), predicted=153_600)
    assert off.dimension_values("difference")[0] == 6400
    assert off.opts.get().kwargs["ylim"][1] == pytest.approx(6400 * 1.2)
    assert len(bytes_difference_plot(history)) == 0


def test_bytes_per_epoch_without_formula() -> None:
    history = pd.DataFrame({"epoch": [0, 1], "comm_bytes": [2048, 4096]})
    el = bytes_per_epoch_plot(history)
    assert len(el) == 1 and isinstance(el.get(0), hv.Curve)
    assert hv.render(el, backend="bokeh").title.text == "bytes/epoch: 3.0 KiB"
    hv.render(bytes_per_epoch_plot(history.iloc[:0], predicted=10), backend="bokeh")
