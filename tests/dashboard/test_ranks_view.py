"""Tests for dashboard.views.ranks and dashboard.style: per-rank shares, efficiency, one scheme."""

from __future__ import annotations

import holoviews as hv
import pandas as pd
import pytest

from dashboard.style import CLASS_COLORS, OP_COLORS, op_legend
from dashboard.views.ranks import efficiency_plot, rank_figures, shares_plot, shares_table
from gnnpipe import schedule
from gnnpipe.analysis.efficiency import CLASSES, Layout, efficiency, rank_shares
from gnnpipe.core.job import TrainConfig
from gnnpipe.core.timeline import KINDS
from gnnpipe.schedule.simulator import simulate

CONFIG = TrainConfig.from_dict({"mode": "pipeline", "stages": 3, "ways": 1, "chunks": 4})


@pytest.fixture
def timeline():
    one = simulate(schedule.gnnpipe(3, 4), {"forward": 1, "backward": 2}).df
    two = one.assign(epoch=1, start=one["start"] + 50, end=one["end"] + 50)
    from gnnpipe.core.timeline import Timeline

    return Timeline(pd.concat([one, two], ignore_index=True))


def test_one_scheme_covers_every_kind_and_class() -> None:
    assert set(OP_COLORS) == set(KINDS)
    assert len(set(OP_COLORS.values())) == len(OP_COLORS)
    assert set(CLASS_COLORS) == set(CLASSES)
    assert CLASS_COLORS["compute"] == OP_COLORS["forward"]
    assert CLASS_COLORS["waiting"] == OP_COLORS["recv"]
    assert CLASS_COLORS["idle"] == OP_COLORS["idle"]
    assert [color for _, color in op_legend()] == [OP_COLORS[k] for k in KINDS]


def test_figures_are_the_librarys(timeline) -> None:
    shares, per_epoch = rank_figures(timeline, CONFIG)
    pd.testing.assert_frame_equal(shares, rank_shares(timeline))
    pd.testing.assert_frame_equal(per_epoch, efficiency(timeline, Layout.of(CONFIG)))
    empty_shares, empty_eff = rank_figures(timeline, TrainConfig.from_dict({"mode": "single"}))
    assert empty_shares.empty and empty_eff.empty
    assert "no per-rank breakdown" in shares_table(empty_shares, empty_eff)


def test_shares_bars_stack_to_one_per_rank(timeline) -> None:
    shares, _ = rank_figures(timeline, CONFIG)
    el = shares_plot(shares)
    df = el.dframe()
    assert len(df) == 3 * len(CLASSES)
    assert list(dict.fromkeys(df["rank"])) == ["0", "1", "2"]
    assert df.groupby("rank")["share"].sum().round(9).eq(1.0).all()
    fig = hv.render(el, backend="bokeh")
    (item,) = fig.legend[0].items  # one item per value of the field: the browser groups them
    assert item.label.field == "class"
    mapper = item.renderers[0].glyph.fill_color.transform
    assert dict(zip(mapper.factors, mapper.palette)) == CLASS_COLORS


def test_efficiency_curve_and_table(timeline) -> None:
    shares, per_epoch = rank_figures(timeline, CONFIG)
    el = efficiency_plot(per_epoch)
    assert list(el.dimension_values("epoch")) == [0, 1]
    median = per_epoch["efficiency"].median()
    assert hv.render(el, backend="bokeh").title.text == f"parallel efficiency: median {median:.0%}"
    table = shares_table(shares, per_epoch)
    assert table.count("\n| ") == 3 and f"**{median:.0%}**" in table
    hv.render(efficiency_plot(per_epoch.iloc[:0]), backend="bokeh")
