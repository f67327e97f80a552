"""Tests for dashboard.views.timeline: lanes, rows, colours and legend, per-lane bubble, hover,
the predicted pair and the bar cap."""

from __future__ import annotations

import holoviews as hv
import numpy as np
import pandas as pd
import pytest

from dashboard.style import OP_COLORS as KIND_COLORS
from dashboard.style import OP_LABELS, OTHER_COLOR
from dashboard.views import timeline as timeline_view
from dashboard.views.timeline import (
    COMM_KINDS,
    lane_labels,
    select_epoch,
    timeline_epochs,
    timeline_frame,
    timeline_plot,
)
from gnnpipe import schedule
from gnnpipe.core.timeline import KINDS, Timeline
from gnnpipe.schedule.simulator import simulate


@pytest.fixture
def timeline() -> Timeline:
    return simulate(schedule.gnnpipe(3, 4, step=True), {"forward": 1, "backward": 2, "step": 1})


def test_one_rectangle_per_op_in_rank_lanes(timeline: Timeline) -> None:
    el = timeline_plot(timeline)
    assert isinstance(el, hv.Rectangles)
    assert len(el) == len(timeline) == 27
    np.testing.assert_array_equal(el.dimension_values("start"), timeline.df["start"])
    np.testing.assert_array_equal(el.dimension_values("end"), timeline.df["end"])
    lo, hi = el.dimension_values("lo"), el.dimension_values("hi")
    ranks = timeline.df["rank"].to_numpy()
    assert (lo > ranks - 0.5).all() and (hi < ranks + 0.5).all() and (hi > lo).all()  # own lane
    assert sorted(set(el.dimension_values("rank"))) == [0, 1, 2]


def test_communication_has_its_own_band_below_compute() -> None:
    """A send that spans the rank's computing (asynchronous) is drawn in the thin band under
    the lane's compute bars, so no compute bar is covered."""
    rows = [(0, "forward", 0.0, 1.0), (0, "send", 0.5, 3.0), (0, "forward", 1.0, 2.0),
            (1, "recv", 0.0, 1.2), (1, "forward", 1.2, 2.2), (0, "allreduce", 3.0, 3.5)]
    df = pd.DataFrame([{"rank": r, "stage": r, "way": 0, "chunk": 0, "epoch": 0, "kind": k,
                        "start": a, "end": b, "bytes": 0, "peer": -1} for r, k, a, b in rows])
    frame = timeline_frame(Timeline(df))
    comm = frame["kind"].isin(COMM_KINDS)
    assert (frame.loc[comm, "lo"] > frame.loc[~comm, "hi"].groupby(frame["rank"]).max()
            .reindex(frame.loc[comm, "rank"]).to_numpy()).all()
    assert (frame.loc[comm, "hi"] - frame.loc[comm, "lo"] < frame.loc[~comm, "hi"].iloc[0]
            - frame.loc[~comm, "lo"].iloc[0]).all()  # thinner than a compute bar


def test_colours_by_kind(timeline: Timeline) -> None:
    assert set(KINDS) <= set(KIND_COLORS)
    assert len(set(KIND_COLORS.values())) == len(KIND_COLORS)
    el = timeline_plot(timeline)
    kinds, colors = el.dimension_values("kind"), el.dimension_values("color")
    assert [KIND_COLORS[k] for k in kinds] == list(colors)
    assert set(colors) == {KIND_COLORS["forward"], KIND_COLORS["backward"], KIND_COLORS["step"]}
    assert el.opts.get().kwargs["color"] == "color"


def test_unknown_kind_gets_fallback_colour() -> None:
    df = pd.DataFrame([{"rank": 0, "stage": 0, "way": 0, "chunk": 0, "epoch": 0,
                        "kind": "mystery", "start": 0.0, "end": 1.0, "bytes": 0, "peer": -1}])
    assert list(timeline_plot(Timeline(df)).dimension_values("color")) == [OTHER_COLOR]


def test_bokeh_render_has_hover_lanes_and_title(timeline: Timeline) -> None:
    fig = hv.render(timeline_plot(timeline, title="gnnpipe"), backend="bokeh")
    hover = [t for t in fig.tools if type(t).__name__ == "HoverTool"]
    assert hover, "hover tool missing"
    fields = " ".join(label for label, _ in hover[0].tooltips)
    for name in ("chunk", "kind", "start", "end"):
        assert name in fields
    bubble = timeline.bubble_by_rank()
    assert fig.yaxis[0].major_label_overrides == {
        r: f"rank {r} · bubble {bubble[r]:.0%}" for r in range(3)}
    assert fig.title.text.startswith("gnnpipe: makespan 19 s")


def test_legend_shows_the_whole_op_kind_scheme(timeline: Timeline) -> None:
    fig = hv.render(timeline_plot(timeline), backend="bokeh")
    legends = [m for m in fig.right if type(m).__name__ == "Legend"]
    assert len(legends) == 1
    items = legends[0].items
    labels = [item.label.value for item in items]
    assert labels == [OP_LABELS.get(k, k) for k in KINDS]
    colors = [item.renderers[0].glyph.fill_color for item in items]
    assert colors == [KIND_COLORS[k] for k in KINDS]
    assert fig.background_fill_color == KIND_COLORS["idle"]  # gaps read as idle


def test_lane_bubble_is_the_ranks_idle_share(timeline: Timeline) -> None:
    """Each lane's bubble is 1 − busy / makespan for that rank; their mean is the title's."""
    bubble = timeline.bubble_by_rank()
    busy = timeline.busy_time()
    assert list(bubble.index) == [0, 1, 2]
    np.testing.assert_allclose(bubble, 1 - busy / timeline.makespan())
    assert bubble.mean() == pytest.approx(timeline.bubble_fraction())
    assert bubble.nunique() == 1  # gnnpipe(3, 4) with equal costs: every lane idles the same
    skewed = Timeline(timeline.df[~((timeline.df["rank"] == 2)
                                    & (timeline.df["kind"] == "step"))])
    per_rank = skewed.bubble_by_rank()
    assert per_rank[2] > per_rank[0]
    assert per_rank.mean() == pytest.approx(skewed.bubble_fraction())
    labels = dict(lane_labels(skewed))
    assert labels[2] == f"rank 2 · bubble {per_rank[2]:.0%}"


def test_bar_cap_keeps_the_latest_ops(monkeypatch: pytest.MonkeyPatch,
                                      timeline: Timeline) -> None:
    monkeypatch.setattr(timeline_view, "MAX_BARS", 10)
    el = timeline_view.timeline_plot(timeline, title="x")
    assert len(el) == 10
    assert el.dimension_values("start").min() >= np.sort(timeline.df["start"])[-10]
    assert el.opts.get().kwargs["title"].startswith("last 10 of 27 ops · x:")


def test_predicted_beside_measured(timeline: Timeline) -> None:
    predicted = simulate(schedule.gnnpipe(3, 4), 1.0)
    layout = timeline_plot(timeline, title="measured", predicted=predicted)
    assert isinstance(layout, hv.Layout)
    measured_el, predicted_el = layout
    assert len(measured_el) == len(timeline) and len(predicted_el) == len(predicted)
    assert predicted_el.opts.get().kwargs["title"].startswith("predicted:")
    hv.render(layout, backend="bokeh")


def test_pure_function_and_empty_timeline(timeline: Timeline) -> None:
    before = timeline.df.copy()
    timeline_plot(timeline)
    pd.testing.assert_frame_equal(timeline.df, before)
    empty = timeline_plot(Timeline())
    assert len(empty) == 0
    hv.render(empty, backend="bokeh")


@pytest.fixture
def two_epochs() -> Timeline:
    """Epoch 0 of gnnpipe(2, 3) at t=0 and a shifted copy as epoch 1 from t=100."""
    first = simulate(schedule.gnnpipe(2, 3), {"forward": 1, "backward": 2}).df
    second = first.assign(epoch=1, start=first["start"] + 100, end=first["end"] + 100)
    return Timeline(pd.concat([first, second], ignore_index=True))


def test_timeline_epochs(two_epochs: Timeline) -> None:
    assert timeline_epochs(two_epochs) == [0, 1]
    assert timeline_epochs(Timeline()) == []


def test_a_live_timeline_follows_only_epochs_every_rank_reported(two_epochs: Timeline) -> None:
    df = two_epochs.df
    partial = Timeline(df[(df["epoch"] == 0) | (df["rank"] == 0)])  # rank 1 not in yet at epoch 1
    assert timeline_epochs(partial) == [0, 1]
    assert timeline_epochs(partial, ranks=2) == [0]
    assert timeline_epochs(two_epochs, ranks=2) == [0, 1]


def test_select_epoch_filters_and_rebases(two_epochs: Timeline) -> None:
    before = two_epochs.df.copy()
    one = select_epoch(two_epochs, 1)
    assert isinstance(one, Timeline)
    assert len(one) == 12 and set(one.df["epoch"]) == {1}
    assert one.df["start"].min() == 0.0
    zero = select_epoch(two_epochs, 0)
    np.testing.assert_array_equal(one.df["start"], zero.df["start"])
    np.testing.assert_array_equal(one.df["end"], zero.df["end"])
    assert one.makespan() == zero.makespan() == 12.0  # (C+S-1)(f+b)
    pd.testing.assert_frame_equal(two_epochs.df, before)  # input untouched
    assert len(select_epoch(two_epochs, 7)) == 0


def test_epoch_argument_draws_one_epoch(two_epochs: Timeline) -> None:
    whole = timeline_plot(two_epochs)
    assert len(whole) == 24
    assert "makespan 112 s" in whole.opts.get().kwargs["title"]
    el = timeline_plot(two_epochs, epoch=1)
    assert len(el) == 12 and set(el.dimension_values("epoch")) == {1}
    assert el.dimension_values("start").min() == 0.0
    assert "makespan 12 s" in el.opts.get().kwargs["title"]


@pytest.mark.parametrize(("stages", "chunks", "text"),
                         [(4, 8, "bubble 27.3%"), (2, 3, "bubble 25.0%"), (1, 4, "bubble 0.0%")])
def test_title_shows_bubble_fraction(stages: int, chunks: int, text: str) -> None:
    tl = simulate(schedule.gnnpipe(stages, chunks), 1.0)
    title = timeline_plot(tl, title="x").opts.get().kwargs["title"]
    assert title.endswith(text)
    fig = hv.render(timeline_plot(tl), backend="bokeh")
    assert text in fig.title.text
