"""Tests for dashboard.views.schedule: the explorer's two schedules, bubbles beside formulas,
the step player (what each rank runs and holds), opening on a run, and the panel."""

from __future__ import annotations

import holoviews as hv
import panel as pn
import pytest
from bokeh.models import Title

from dashboard.views.schedule import BUILDERS, ScheduleExplorer
from gnnpipe import schedule
from gnnpipe.core.job import TrainConfig
from gnnpipe.run import Run
from gnnpipe.schedule.simulator import simulate

NAMES = ["gnnpipe", "gpipe", "1f1b", "interleaved", "zb-h1"]
TORCH = ["torch:GPipe", "torch:1F1B", "torch:Interleaved1F1B", "torch:LoopedBFS",
         "torch:InterleavedZeroBubble", "torch:ZBVZeroBubble", "torch:DualPipeV"]


def test_defaults_and_param_docs() -> None:
    ex = ScheduleExplorer()
    assert (ex.schedule, ex.other, ex.stages, ex.chunks, ex.virtual) == ("gnnpipe", "1f1b", 4, 8, 2)
    assert (ex.forward, ex.backward, ex.comm, ex.step) == (1.0, 2.0, 0.0, 0)
    assert ex.param["schedule"].objects == ex.param["other"].objects == NAMES + TORCH == list(
        BUILDERS)
    assert ex.param["stages"].bounds == (1, 16) and ex.param["chunks"].bounds == (1, 64)
    for name in ("schedule", "other", "stages", "chunks", "virtual", "forward", "backward", "comm"):
        assert ex.param[name].doc
    with pytest.raises(ValueError):
        ex.stages = 17
    with pytest.raises(ValueError, match="^which: expected one of"):
        ex.timeline("left")


def test_timeline_follows_parameters() -> None:
    ex = ScheduleExplorer(stages=3, chunks=5)
    tl = ex.timeline()
    assert tl.num_ranks == 3 and len(tl) == 3 * 5 * 2
    assert tl.makespan() == pytest.approx((5 + 3 - 1) * 3.0)  # (C+S-1)(f+b)
    ex.comm = 0.5
    assert ex.timeline().makespan() > tl.makespan()
    ex.schedule = "1f1b"
    assert ex.build().name == "1f1b"
    ex.other = "zb-h1"
    assert ex.build("other").name == "zb-h1"
    assert set(ex.timeline("other").df["kind"]) == {"forward", "backward", "weight"}


def test_bubble_changes_with_stages_and_chunks() -> None:
    ex = ScheduleExplorer()
    base = ex.bubble()
    ex.stages = 8
    more_stages = ex.bubble()
    ex.chunks = 32
    more_chunks = ex.bubble()
    assert more_stages > base > 0 and more_chunks < more_stages
    ex.stages = 1
    assert ex.bubble() == 0.0


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(("stages", "chunks"), [(1, 1), (2, 2), (2, 4), (4, 8), (4, 4), (5, 10)])
def test_equal_costs_bubble_is_formula(name: str, stages: int, chunks: int) -> None:
    ex = ScheduleExplorer(schedule=name, stages=stages, chunks=chunks, virtual=2,
                          forward=1.0, backward=1.0, comm=0.0)
    expected = {"interleaved": (stages - 1) / (2 * chunks + stages - 1),
                "zb-h1": (stages - 1) / (2 * chunks + stages - 1)}.get(
        name, (stages - 1) / (chunks + stages - 1))
    assert ex.formula() == pytest.approx(expected, abs=1e-15)
    assert ex.bubble() == pytest.approx(ex.formula(), abs=1e-12)


def test_interleaved_needs_a_multiple_of_stages() -> None:
    ex = ScheduleExplorer(schedule="interleaved", stages=4, chunks=6)
    assert "multiple of stages" in ex.summary()
    assert isinstance(ex.plot(), hv.Text)
    with pytest.raises(ValueError, match="multiple of stages"):
        ex.timeline()


def test_player_state_matches_grid() -> None:
    ex = ScheduleExplorer(schedule="gnnpipe", other="zb-h1", stages=2, chunks=3,
                          forward=1.0, backward=2.0)  # ZB-H1: T_F = T_B = T_W = 1
    assert ex.times() == [float(t) for t in range(11)] + [12.0]  # gnnpipe ends at 12
    ex.step = 2  # t = 2: gnnpipe 2x3 runs F2 on rank 0 and F1 on rank 1 (its grid's step 2)
    st = ex.state()
    assert st["op"].tolist() == ["F2", "F1"] and st["chunk"].tolist() == [2, 1]
    assert st["held"].tolist() == [2, 1]
    zb = ex.state("other", 4.0)  # zb-h1 2x3 at step 4: r0 W0, r1 B1
    grid = str(schedule.zb_h1(2, 3)).splitlines()[2 + 4].split()
    assert zb["op"].tolist() == grid[1:] == ["W0", "B1"]
    assert zb["held"].tolist() == [2, 2]  # chunk 0 stays held until its W0 ends
    assert "| 0 | F2 | 2 | 2 |" in ex.state_text()
    ex.step = 100  # past the end: the last instant, everything idle and freed
    assert ex.state()["op"].tolist() == [".", "."] and ex.state()["held"].tolist() == [0, 0]


def test_interleaved_state_labels() -> None:
    ex = ScheduleExplorer(schedule="interleaved", stages=2, chunks=4, forward=2.0, backward=2.0)
    # Each virtual op costs 1, so times are the grid's steps.
    rows = str(schedule.interleaved_1f1b(2, 4, 2)).splitlines()[2:]
    for t in (0, 4, 9, 15):
        assert ex.state(time=float(t))["op"].tolist() == rows[t].split()[1:]


def test_plot_and_summary() -> None:
    ex = ScheduleExplorer(stages=4, chunks=8)
    el = ex.plot()
    assert isinstance(el, hv.Overlay)
    bars = el.values()[0]
    assert isinstance(bars, hv.Rectangles) and len(bars) == 64
    assert bars.opts.get().kwargs["title"].endswith("bubble 27.3%")
    assert "bubble 27.3%" in ex.summary() and "(S−1)/(C+S−1) = **27.3%**" in ex.summary()
    assert "(S−1)/(v·C+S−1)" in ScheduleExplorer(schedule="interleaved").summary()


def test_for_run_opens_on_its_stages_chunks_and_costs() -> None:
    tl = simulate(schedule.gnnpipe(3, 6, step=True), {"forward": 0.5, "backward": 1.5,
                                                      "step": 0.25}, comm=0.125)
    run = Run(TrainConfig.from_dict({"mode": "pipeline", "stages": 3, "chunks": 6}), timeline=tl)
    ex = ScheduleExplorer.for_run(run, other="interleaved")
    assert (ex.stages, ex.chunks, ex.other) == (3, 6, "interleaved")
    assert (ex.forward, ex.backward, ex.comm) == (0.5, 1.5, 0.125)
    assert ex.timeline().makespan() == tl.makespan() - 0.25  # the explorer adds no step
    single = ScheduleExplorer.for_run(Run(TrainConfig.from_dict({"mode": "single"})))
    assert (single.stages, single.chunks) == (4, 8)


def _titles(model) -> list[str]:
    return [t.text for t in model.select({"type": Title}) if t.text]


def test_panel_renders_and_updates() -> None:
    ex = ScheduleExplorer()
    column = ex.panel()
    assert isinstance(column, pn.Column)
    root = column.get_root()
    titles = _titles(root)
    assert any("gnnpipe, S=4, C=8" in t and "bubble 27.3%" in t for t in titles)
    assert any(t.startswith("1f1b, S=4, C=8") for t in titles)
    controls, first, second, symbols = column
    assert all(isinstance(side, pn.Column) for side in (first, second))  # stacked, full width
    widgets, player = controls
    assert isinstance(player, pn.widgets.Player)
    assert player.end == len(ex.times()) - 1
    assert {"stages", "chunks", "schedule", "other", "virtual"} <= set(widgets.parameters)
    assert all(f"`{k}`" in symbols.object for k in ("S", "C", "v", "T_F", "T_B", "T_W"))
    ex.param.update(stages=2, chunks=3)
    assert player.end == len(ex.times()) - 1
    assert any("S=2, C=3" in t and "bubble 25.0%" in t for t in _titles(root))
    player.value = 2
    assert ex.step == 2
    assert "| 0 | F2 | 2 |" in ex.state_text()
    pn.panel(ex.panel()).get_root()


def test_both_timelines_share_one_time_axis_and_cursor() -> None:
    ex = ScheduleExplorer(schedule="gnnpipe", other="zb-h1", stages=4, chunks=8, step=20)
    spans = [ex.timeline(w).makespan() for w in ("schedule", "other")]
    assert spans[0] != spans[1] and ex.span() == max(spans)
    for which in ("schedule", "other"):
        plot = ex.plot(which)
        assert plot.opts.get().kwargs["xlim"] == (0, ex.span())
        cursor = next(el for el in plot.values() if isinstance(el, hv.VLine))
        assert cursor.data == ex.now() > 0
    assert f"t = {ex.now():.4g} s" in ex.state_text() and f"t = {ex.now():.4g} s" in ex.state_text(
        "other")


@pytest.mark.parametrize("name", TORCH)
def test_every_torch_schedule_draws_with_its_paper(name: str) -> None:
    ex = ScheduleExplorer(schedule=name, stages=4, chunks=8, virtual=2)
    assert ex.timeline().makespan() > 0 and isinstance(ex.plot(), hv.Overlay)
    summary = ex.summary()
    assert "PyTorch Schedule" in summary and "bubble" in summary
    if name in ("torch:GPipe", "torch:1F1B", "torch:Interleaved1F1B", "torch:LoopedBFS"):
        assert ex.bubble() == pytest.approx(ex.formula(), abs=1e-9)  # forward 1, backward 2 ...
    else:
        assert "no closed-form bubble" in summary
