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


def test_one_epochs_bubble_shares_and_efficiency_agree_on_a_real_run(cluster, small_graph):
    """A real 2-stage pipeline: per epoch, the timeline title's bubble is 1 − the ranks' mean
    compute share (= communication + waiting + idle), and the Ranks card's efficiency is
    (1 − bubble) × (C′+S−1)/C′; the Stage timeline card's text states both with these values."""
    import gnnpipe as gp
    from dashboard.views.ranks import epoch_relation
    from dashboard.views.timeline import select_epoch, timeline_plot
    from gnnpipe.analysis.efficiency import rank_breakdown

    model = gp.models.gcn(small_graph.num_features, hidden=16, out_dim=4, layers=4)
    run = gp.train(model, small_graph, "pipeline", stages=2, chunks=4, epochs=4, cluster=cluster,
                   progress=False)
    per_rank, per_epoch = rank_breakdown(run.timeline), run.efficiency().set_index("epoch")
    stretch = Layout.of(run.config).bubble_stretch
    for epoch in range(1, 4):
        mine = per_rank[per_rank["epoch"] == epoch]
        shares = {c: (mine[c] / mine["span"]).mean() for c in CLASSES}
        assert sum(shares.values()) == pytest.approx(1.0)
        bubble = select_epoch(run.timeline, epoch).bubble_fraction()
        assert bubble == pytest.approx(1 - shares["compute"], abs=1e-9)
        assert bubble == pytest.approx(shares["communication"] + shares["waiting"]
                                       + shares["idle"], abs=1e-9)
        assert per_epoch.loc[epoch, "efficiency"] == pytest.approx((1 - bubble) * stretch)
        text = epoch_relation(run.timeline, run.config, epoch)
        assert f"**{bubble:.1%}**" in text and f"**{(1 - bubble) * stretch:.1%}**" in text
        title = timeline_plot(select_epoch(run.timeline, epoch)).opts.get().kwargs["title"]
        assert title.endswith(f"bubble {bubble:.1%}")
