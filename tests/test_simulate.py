"""Tests for gnnpipe.schedule.simulator and the Timeline metrics and trace export it feeds."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import pandas as pd
import pytest

from gnnpipe import schedule
from gnnpipe.core.timeline import COLUMNS, Timeline
from gnnpipe.schedule import Op, Schedule
from gnnpipe.schedule.simulator import simulate

FB = {"forward": 1.0, "backward": 2.0}


@pytest.mark.parametrize("stages, chunks", [
    (1, 1), (1, 7), (2, 1), (2, 3), (3, 5), (4, 8), (4, 16), (8, 32), (5, 2),
])
def test_gnnpipe_bubble_matches_formula(stages: int, chunks: int) -> None:
    tl = simulate(schedule.gnnpipe(stages, chunks), 1.0)
    expected = Fraction(stages - 1, chunks + stages - 1)
    # Unit costs keep every time an exact integer, so the fraction is exact.
    idle = Fraction(int(tl.makespan()) * stages - int(tl.busy_time().sum()),
                    int(tl.makespan()) * stages)
    assert idle == expected
    assert tl.bubble_fraction() == pytest.approx(float(expected), abs=1e-12)
    assert tl.makespan() == 2 * (chunks + stages - 1)


def test_timeline_rows_and_columns() -> None:
    tl = simulate(schedule.gnnpipe(3, 2), FB)
    df = tl.df
    assert list(df.columns) == list(COLUMNS)
    assert len(tl) == 12
    assert (df["rank"] == df["stage"]).all()
    assert (df["epoch"] == 0).all() and (df["bytes"] == 0).all() and (df["peer"] == -1).all()
    assert (df["way"] == 0).all()
    assert df["kind"].tolist()[:4] == ["forward", "forward", "backward", "backward"]
    assert df["chunk"].tolist()[:4] == [0, 1, 1, 0]


def test_gnnpipe_hand_computed_times() -> None:
    # S=2, C=3, forward 1 s, backward 2 s:
    # rank 1: F0 1-2, F1 2-3, F2 3-4, B2 4-6, B1 6-8, B0 8-10
    # rank 0: F0 0-1, F1 1-2, F2 2-3, B2 6-8, B1 8-10, B0 10-12
    df = simulate(schedule.gnnpipe(2, 3), FB).df
    assert df["start"].tolist() == [0, 1, 2, 6, 8, 10, 1, 2, 3, 4, 6, 8]
    assert df["end"].tolist() == [1, 2, 3, 8, 10, 12, 2, 3, 4, 6, 8, 10]


@pytest.mark.parametrize("sched, makespan", [
    (schedule.gnnpipe(2, 3), 12.0),     # (C+S-1)(f+b) = 4 * 3
    (schedule.gpipe(4, 8), 33.0),       # 11 * 3
    (schedule.one_f_one_b(3, 5), 21.0),  # (M+S-1)(f+b) = 7 * 3
    (schedule.one_f_one_b(4, 2), 15.0),  # 5 * 3
])
def test_makespan_forward_1_backward_2(sched: Schedule, makespan: float) -> None:
    assert simulate(sched, FB).makespan() == makespan


def test_comm_delay_on_cross_rank_dependencies() -> None:
    # As above with 0.5 s per stage crossing: rank 1 F0 starts at 1.5, ..., B0 ends 10.5;
    # rank 0's B2 waits for 6.5 + 0.5, so B2 7-9, B1 9-11, B0 11-13.
    tl = simulate(schedule.gnnpipe(2, 3), FB, comm=0.5)
    df = tl.df
    assert df.loc[df["rank"] == 1, "start"].tolist() == [1.5, 2.5, 3.5, 4.5, 6.5, 8.5]
    assert df.loc[df["rank"] == 0, "start"].tolist() == [0, 1, 2, 7, 9, 11]
    assert tl.makespan() == 13.0
    # One stage: nothing crosses ranks, so comm changes nothing.
    assert simulate(schedule.gnnpipe(1, 4), FB, comm=5.0).makespan() == 12.0


def test_busy_time_is_conserved() -> None:
    def cost(op: Op) -> float:
        return 0.1 * (op.stage + 1) + 0.01 * op.chunk + (0.3 if op.kind == "backward" else 0.0)

    for sched in (schedule.gnnpipe(4, 6), schedule.gpipe(3, 5), schedule.one_f_one_b(4, 9)):
        tl = simulate(sched, cost, comm=0.05)
        expected = sum(cost(op) for op in sched.ops())
        assert tl.busy_time().sum() == pytest.approx(expected, rel=1e-12)
        per_rank = [sum(cost(op) for op in ops) for ops in sched.ranks]
        assert tl.busy_time().tolist() == pytest.approx(per_rank, rel=1e-12)
        # No rank runs two ops at once, and every op starts after its dependencies.
        for _, lane in tl.df.groupby("rank"):
            assert (lane["start"].to_numpy()[1:] >= lane["end"].to_numpy()[:-1] - 1e-12).all()


def test_most_specific_cost_wins() -> None:
    costs = {"forward": 1.0, ("forward", 1): 5.0, ("forward", 1, 2): 9.0, "backward": 2.0}
    df = simulate(schedule.gnnpipe(2, 3), costs).df
    dur = (df["end"] - df["start"]).tolist()
    assert dur[:3] == [1.0, 1.0, 1.0]            # stage 0 forwards: by kind
    assert dur[6:9] == [5.0, 5.0, 9.0]           # stage 1: by (kind, stage), chunk 2 exact
    assert dur[3:6] == dur[9:] == [2.0, 2.0, 2.0]


def test_missing_cost_names_the_key() -> None:
    with pytest.raises(ValueError, match=r"no entry for op \('backward', 1, 2, 0\).*'backward'"):
        simulate(schedule.gnnpipe(2, 3), {"forward": 1.0})
    with pytest.raises(ValueError, match="'step'"):
        simulate(schedule.gnnpipe(2, 3, step=True), FB)
    tl = simulate(schedule.gnnpipe(2, 3, step=True), {**FB, "step": 0.5})
    assert tl.makespan() == 12.5


@pytest.mark.parametrize("costs", [-1.0, math.nan, math.inf, {"forward": 1, "backward": -2}])
def test_invalid_costs_raise_value_error(costs: object) -> None:
    with pytest.raises(ValueError, match="costs"):
        simulate(schedule.gnnpipe(2, 2), costs)


def test_wrong_types_raise_type_error() -> None:
    with pytest.raises(TypeError, match="costs"):
        simulate(schedule.gnnpipe(2, 2), "fast")
    with pytest.raises(TypeError, match="comm"):
        simulate(schedule.gnnpipe(2, 2), 1.0, comm="slow")
    with pytest.raises(ValueError, match="comm"):
        simulate(schedule.gnnpipe(2, 2), 1.0, comm=-0.1)


def test_peak_inflight_1f1b_vs_gpipe() -> None:
    stages, micro = 4, 12
    gp_peak = simulate(schedule.gpipe(stages, micro), FB).peak_inflight()
    fb_peak = simulate(schedule.one_f_one_b(stages, micro), FB).peak_inflight()
    assert gp_peak.tolist() == [micro] * stages
    assert fb_peak.tolist() == [stages - s for s in range(stages)]
    assert fb_peak.loc[0] == stages
    assert gp_peak.name == "peak_inflight" and gp_peak.index.name == "rank"


def test_peak_inflight_ties_free_first() -> None:
    def row(rank: int, chunk: int, kind: str, start: float, end: float) -> dict:
        return {"rank": rank, "stage": rank, "way": 0, "chunk": chunk, "epoch": 0, "kind": kind,
                "start": start, "end": end, "bytes": 0, "peer": -1}

    # Chunk 1's forward ends exactly when chunk 0's backward ends: the peak stays 1.
    tl = Timeline(pd.DataFrame([
        row(0, 0, "forward", 0, 1), row(0, 0, "backward", 1, 2),
        row(0, 1, "forward", 1, 2), row(0, 1, "backward", 2, 3),
        row(1, -1, "step", 0, 1),
    ]))
    assert tl.peak_inflight().tolist() == [1, 0]


def test_chrome_trace_is_valid(tmp_path) -> None:
    tl = simulate(schedule.gnnpipe(3, 4, step=True), {**FB, "step": 0.25})
    path = tl.to_chrome_trace(tmp_path / "trace.json")
    assert path == tmp_path / "trace.json"
    trace = json.loads(path.read_text())
    assert trace["displayTimeUnit"] == "ms"
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    ms = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    assert len(xs) == len(tl) == 3 * (2 * 4 + 1)
    assert sorted((e["tid"], e["args"]["name"]) for e in ms) == [
        (0, "rank 0"), (1, "rank 1"), (2, "rank 2")]
    assert all(e["name"] == "thread_name" and e["pid"] == 0 for e in ms)
    first = xs[0]
    assert (first["name"], first["cat"], first["ts"], first["dur"]) == ("F c0", "forward", 0, 1e6)
    assert first["args"] == {"stage": 0, "way": 0, "chunk": 0, "epoch": 0, "bytes": 0, "peer": -1}
    back = next(e for e in xs if e["cat"] == "backward" and e["tid"] == 2)
    assert back["name"] == "B c3" and back["dur"] == 2e6
    assert {e["name"] for e in xs if e["cat"] == "step"} == {"step"}
    assert sum(e["dur"] for e in xs) == pytest.approx(tl.busy_time().sum() * 1e6)


def test_deadlock_same_rank_order() -> None:
    # Rank 1 lists the backward of chunk 0 before the forward it needs.
    sched = Schedule("bad", 2, 1, (
        (Op("forward", 0, 0),),
        (Op("backward", 1, 0, deps=(("forward", 1, 0, 0),)),
         Op("forward", 1, 0, deps=(("forward", 0, 0, 0),))),
    ))
    with pytest.raises(ValueError, match=r"deadlock.*rank 1 is stuck at \('backward', 1, 0, 0\)"):
        simulate(sched, 1.0)


def test_deadlock_cross_rank_cycle() -> None:
    sched = Schedule("cycle", 2, 1, (
        (Op("forward", 0, 0, deps=(("forward", 1, 0, 0),)),),
        (Op("forward", 1, 0, deps=(("forward", 0, 0, 0),)),),
    ))
    with pytest.raises(ValueError, match="cannot progress") as info:
        simulate(sched, 1.0)
    assert "rank 0" in str(info.value) and "rank 1" in str(info.value)


def test_empty_schedule_gives_empty_timeline() -> None:
    tl = simulate(Schedule("empty", 1, 1, ((),)), 1.0)
    assert len(tl) == 0 and tl.makespan() == 0.0


def _exact_bubble(tl: Timeline) -> Fraction:
    """Idle share of an integer-timed timeline, as an exact fraction."""
    span, ranks = int(tl.makespan()), tl.num_ranks
    return Fraction(span * ranks - int(tl.busy_time().sum()), span * ranks)


@pytest.mark.parametrize("stages, virtual, chunks", [
    (1, 2, 3), (2, 2, 2), (2, 2, 4), (2, 3, 6), (3, 2, 6), (4, 2, 4), (4, 2, 8), (4, 3, 12),
    (4, 4, 16), (5, 2, 10),
])
def test_interleaved_bubble_matches_formula(stages: int, virtual: int, chunks: int) -> None:
    # Equal costs with virtual stages: a full stage's forward (and backward) costs v units, so
    # each virtual-stage op costs 1 = 1/v of it; unit costs keep the fraction exact.
    sched = schedule.interleaved_1f1b(stages, chunks, virtual)
    tl = simulate(sched, 1.0)
    assert _exact_bubble(tl) == Fraction(stages - 1, virtual * chunks + stages - 1)
    # Per full stage op f = b = v: makespan 2 (v·C + S − 1) units; 1F1B's is 2 v (C + S − 1).
    assert tl.makespan() == 2 * (virtual * chunks + stages - 1)
    one = simulate(schedule.one_f_one_b(stages, chunks), float(virtual))
    assert tl.makespan() <= one.makespan()
    # Backward twice forward (each 1/v of the stage's): still (S-1)/(v·C+S-1).
    fb = simulate(sched, {"forward": 1 / virtual, "backward": 2 / virtual})
    assert fb.bubble_fraction() == pytest.approx((stages - 1) / (virtual * chunks + stages - 1),
                                                 abs=1e-12)


@pytest.mark.parametrize("stages, chunks", [(2, 2), (2, 5), (3, 3), (3, 8), (4, 4), (4, 9), (5, 12)])
@pytest.mark.parametrize("f, b, w", [(1, 1, 1), (2, 1, 1), (1, 2, 1), (2, 2, 1)])
def test_zb_h1_bubble_matches_paper(stages: int, chunks: int, f: int, b: int, w: int) -> None:
    # Qi et al. 2023: ZB-H1 idles (S-1)(T_F + T_B - T_W) per rank (their figure: T_F = T_B = T_W;
    # it holds while T_W <= T_B), for M >= S and no transfer delay.
    tl = simulate(schedule.zb_h1(stages, chunks), {"forward": f, "backward": b, "weight": w})
    idle = (stages - 1) * (f + b - w)
    assert tl.makespan() == chunks * (f + b + w) + idle
    assert _exact_bubble(tl) == Fraction(idle, chunks * (f + b + w) + idle)
    # A third of 1F1B's bubble with equal costs (1F1B's backward = B + W).
    if f == b == w:
        fb = simulate(schedule.one_f_one_b(stages, chunks), {"forward": f, "backward": b + w})
        assert fb.makespan() - 3 * chunks * f == 3 * idle


def test_zb_h1_keeps_1f1b_memory() -> None:
    zb = simulate(schedule.zb_h1(4, 12), 1.0).peak_inflight()
    fb = simulate(schedule.one_f_one_b(4, 12), FB).peak_inflight()
    # A chunk is held until its weight op: at most S per rank, 1F1B's peak (rank 0's).
    assert zb.max() == fb.max() == 4
    assert zb.tolist() == [4, 4, 4, 4]


def test_inflight_at() -> None:
    tl = simulate(schedule.gnnpipe(2, 3), 1.0)
    # rank 0: F0-F2 end at 1, 2, 3; B2, B1, B0 end at 6, 7, 8.
    assert tl.inflight_at(0.5).tolist() == [0, 0]
    assert tl.inflight_at(2.0).tolist() == [2, 1]
    assert tl.inflight_at(3.5).tolist() == [3, 2]
    assert tl.inflight_at(7.0).tolist() == [1, 0]
    assert tl.inflight_at(100).tolist() == [0, 0]
    assert tl.inflight_at(3.5).name == "inflight"
    zb = simulate(schedule.zb_h1(2, 2), 1.0)
    # zb-h1 2x2, rank 1: F0 1-2, B0 2-3, F1 3-4, B1 4-5, W0 5-6, W1 6-7: a chunk is held
    # until its weight op ends.
    assert zb.inflight_at(4.0).tolist() == [2, 2]
    assert zb.inflight_at(5.5).tolist()[1] == 2
    assert zb.inflight_at(6.0).tolist()[1] == 1
    assert zb.inflight_at(zb.makespan()).tolist() == [0, 0]


def test_weight_costs_and_busy_kind() -> None:
    tl = simulate(schedule.zb_h1(2, 3), {"forward": 1.0, "backward": 1.0, "weight": 0.5})
    assert set(tl.df["kind"]) == {"forward", "backward", "weight"}
    assert tl.busy_time().tolist() == [7.5, 7.5]
    with pytest.raises(ValueError, match="'weight'"):
        simulate(schedule.zb_h1(2, 3), FB)
