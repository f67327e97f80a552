"""Tests for dashboard.views.comm: rank-to-rank matrix, bytes by kind, bytes per epoch."""

from __future__ import annotations

import holoviews as hv
import numpy as np
import pandas as pd
import pytest

from dashboard.views.comm import (
    ALL_LABEL,
    COMM_KIND_COLORS,
    OTHER_COLOR,
    bytes_by_kind_plot,
    bytes_per_epoch_plot,
    comm_matrix_frame,
    comm_matrix_plot,
)


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
    assert len(bytes_by_kind_plot(empty)) == 0
    hv.render(comm_matrix_plot(empty), backend="bokeh")
    hv.render(bytes_by_kind_plot(empty), backend="bokeh")


def test_bytes_by_kind(comm) -> None:
    el = bytes_by_kind_plot(comm)
    assert isinstance(el, hv.Bars)
    df = el.dframe()
    assert list(df["kind"]) == ["activation", "gradient", "allreduce", "eval", "mystery"]
    assert list(df["bytes"]) == [2000, 1600, 120, 50, 5]
    assert list(df["color"]) == [COMM_KIND_COLORS[k] for k in df["kind"][:4]] + [OTHER_COLOR]
    hv.render(el, backend="bokeh")


def test_bytes_per_epoch_with_formula() -> None:
    history = pd.DataFrame({"epoch": range(4), "comm_bytes": [100, 100, 110, 100]})
    el = bytes_per_epoch_plot(history, predicted=100)
    assert isinstance(el, hv.Overlay) and len(el) == 2
    curve, line = el.Curve.Measured, el.HLine.Formula
    np.testing.assert_array_equal(curve.dimension_values("epoch"), [0, 1, 2, 3])
    np.testing.assert_array_equal(curve.dimension_values("comm_bytes"), [100, 100, 110, 100])
    assert line.data == 100.0
    assert line.opts.get().kwargs["line_dash"] == "dashed"
    fig = hv.render(el, backend="bokeh")
    assert "formula 100 B" in fig.title.text and "× 1.000" in fig.title.text


def test_bytes_per_epoch_without_formula() -> None:
    history = pd.DataFrame({"epoch": [0, 1], "comm_bytes": [2048, 4096]})
    el = bytes_per_epoch_plot(history)
    assert len(el) == 1 and isinstance(el.get(0), hv.Curve)
    assert "median 3.0 KiB" in hv.render(el, backend="bokeh").title.text
    hv.render(bytes_per_epoch_plot(history.iloc[:0], predicted=10), backend="bokeh")
