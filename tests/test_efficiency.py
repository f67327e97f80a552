"""Parallel efficiency and the compute / communication / waiting / idle split of a Timeline."""

from __future__ import annotations

import pytest

import gnnpipe as gp
from gnnpipe.analysis.efficiency import CLASSES, Layout, efficiency, rank_breakdown, rank_shares
from gnnpipe.core.job import TrainConfig
from gnnpipe.core.timeline import OpEvent, Timeline


def _op(rank: int, kind: str, start: float, end: float, chunk: int = 0, epoch: int = 0) -> OpEvent:
    return OpEvent(rank, rank, 0, chunk, epoch, kind, start, end)


def test_each_instant_has_one_class_by_precedence() -> None:
    # rank 0: forward 0-1 with a send 0.5-3 still in flight after it, a receive 3-4 (waiting),
    # nothing 4-5, backward 5-6; rank 1 only makes the epoch span 0-7.
    tl = Timeline.from_events([
        _op(0, "forward", 0, 1), _op(0, "send", 0.5, 3), _op(0, "recv", 3, 4),
        _op(0, "backward", 5, 6), _op(1, "forward", 0, 7)])
    row = rank_breakdown(tl).set_index("rank").loc[0]
    assert row["span"] == 7
    assert [row[c] for c in CLASSES] == [2.0, 2.0, 1.0, 2.0]


def test_allreduce_is_communication_and_beats_a_receive() -> None:
    tl = Timeline.from_events([_op(0, "allreduce", 0, 2, chunk=-1), _op(0, "recv", 1, 3)])
    row = rank_breakdown(tl).iloc[0]
    assert (row["compute"], row["communication"], row["waiting"], row["idle"]) == (0, 2, 1, 0)


def test_evaluation_transfers_are_not_training() -> None:
    tl = Timeline.from_events([_op(0, "forward", 0, 1), _op(0, "recv", 1, 9, chunk=-1)])
    assert rank_breakdown(tl).iloc[0]["span"] == 1


@pytest.mark.parametrize(("stages", "chunks"), [(2, 8), (4, 8), (3, 5), (1, 4)])
def test_equal_cost_fill_drain_is_exactly_ideal(stages: int, chunks: int) -> None:
    """The simulator's GNNPipe schedule with equal costs takes (C+S-1)(f+b): the ideal."""
    tl = gp.simulate(gp.schedule.gnnpipe(stages, chunks), {"forward": 1.0, "backward": 2.0})
    layout = Layout(ranks=stages, stages=stages, chunks=chunks)
    one_process = stages * chunks * 3.0
    for reference in (None, one_process):
        row = efficiency(tl, layout, reference).iloc[0]
        assert row["ideal"] == pytest.approx((chunks + stages - 1) * 3.0)
        assert row["efficiency"] == pytest.approx(1.0)
    shares = rank_shares(tl)
    bubble = (stages - 1) / (chunks + stages - 1)
    assert shares["idle"].mean() == pytest.approx(bubble)  # no receives: the bubble is idle


def test_a_slow_stage_lowers_efficiency_by_its_share() -> None:
    """Stage 1 twice as slow: the pipeline runs at stage 1's pace, efficiency drops below 1."""
    tl = gp.simulate(gp.schedule.gnnpipe(2, 8),
                     {("forward", 0): 1.0, ("backward", 0): 1.0,
                      ("forward", 1): 2.0, ("backward", 1): 2.0})
    row = efficiency(tl, Layout(ranks=2, stages=2, chunks=8)).iloc[0]
    # compute 16 + 32 = 48 s over 2 ranks, stretched 9/8: 27 s; the makespan is 2 × (8·2 + 1)
    assert row["ideal"] == pytest.approx(27.0)
    assert row["span"] == pytest.approx(34.0)
    assert row["efficiency"] == pytest.approx(27.0 / 34.0)


def test_layout_of_configs() -> None:
    assert Layout.of(TrainConfig.from_dict({"mode": "single"})) is None
    assert Layout.of(TrainConfig.from_dict({"mode": "graph", "parts": 4})) == Layout(ranks=4)
    hybrid = Layout.of(TrainConfig.from_dict({"mode": "hybrid", "stages": 2, "ways": 2,
                                              "chunks": 16}))
    assert hybrid == Layout(ranks=4, stages=2, ways=2, chunks=16)
    assert hybrid.bubble_stretch == pytest.approx((8 + 1) / 8)


def test_one_process_runs_have_no_efficiency(small_graph) -> None:
    model = gp.models.gcn(small_graph.num_features, hidden=8, out_dim=4, layers=2)
    run = gp.train(model, small_graph, "local", stages=2, chunks=4, epochs=2, progress=False)
    assert run.efficiency().empty
    assert "parallel_efficiency" not in run.summary()
