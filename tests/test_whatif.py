"""Tests for gnnpipe.analysis.whatif: costs read back from a timeline, re-simulated, and the what-if table."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from gnnpipe import schedule
from gnnpipe.analysis.catalogue import bubble_formula, build
from gnnpipe.analysis.whatif import OpCosts, costs_from, predict, what_if
from gnnpipe.core.timeline import Timeline
from gnnpipe.schedule.simulator import simulate

# Binary fractions: every simulated time is exact in floating point, so extracted durations
# and gaps are the costs themselves.
COSTS = {"forward": 0.75, "backward": 1.5, ("forward", 1): 0.5, ("backward", 2, 3): 2.25,
         ("forward", 0, 1): 1.125, "step": 0.125}


@pytest.mark.parametrize("sched", [
    schedule.gnnpipe(3, 5, step=True), schedule.one_f_one_b(3, 6, step=True),
    schedule.gpipe(3, 4, step=True),
])
@pytest.mark.parametrize("comm", [0.0, 0.25])
def test_costs_round_trip_exactly(sched, comm: float) -> None:
    tl = simulate(sched, COSTS, comm=comm)
    costs = costs_from(tl)
    assert (costs.stages, costs.chunks, costs.comm) == (3, sched.num_chunks, comm)
    assert costs.table["forward", 0, 1] == 1.125 and costs.table["backward", 2, 3] == 2.25
    assert costs.table["forward", 1, 0] == 0.5 and costs.table["step", 2] == 0.125
    again = predict(costs, sched)
    assert again.makespan() == tl.makespan()
    assert again.df[["start", "end"]].equals(tl.df[["start", "end"]])


def test_costs_are_medians_over_epochs() -> None:
    one = simulate(schedule.gnnpipe(2, 2), {"forward": 1.0, "backward": 2.0}).df
    slow = simulate(schedule.gnnpipe(2, 2), {"forward": 3.0, "backward": 2.0}).df
    frames = []
    for epoch, df in enumerate([one, one, slow]):
        df = df.copy()
        df["epoch"] = epoch
        df[["start", "end"]] += 100.0 * epoch
        frames.append(df)
    costs = costs_from(Timeline(pd.concat(frames)))
    assert costs.table["forward", 1, 0] == 1.0 and costs.table["backward", 0, 1] == 2.0


def test_other_schedules_and_chunk_counts() -> None:
    costs = OpCosts.uniform(4, 8, forward=1.0, backward=2.0)
    # Same work in 16 chunks: each op costs half.
    tl = predict(costs, schedule.gnnpipe(4, 16))
    assert tl.makespan() == (16 + 3) * 1.5
    # Interleaved, v = 2: each virtual-stage op costs half of a stage's.
    inter = predict(costs, schedule.interleaved_1f1b(4, 8, 2))
    assert inter.bubble_fraction() == pytest.approx(bubble_formula("interleaved", 4, 8, 2)[1])
    assert inter.busy_time().sum() == pytest.approx(4 * 8 * 3.0)
    # ZB-H1: backward split in two halves of 1 s (T_F = T_B = T_W = 1).
    zb = predict(costs, schedule.zb_h1(4, 8))
    assert zb.makespan() == 3 * 8 + 3
    assert zb.bubble_fraction() == pytest.approx(bubble_formula("zb-h1", 4, 8, 2, 1.0, 2.0)[1])
    with pytest.raises(ValueError, match="^schedule: expected 4 ranks"):
        predict(costs, schedule.gnnpipe(3, 8))


def test_what_if_table() -> None:
    tl = simulate(schedule.gnnpipe(2, 4, step=True), COSTS | {("forward", 1): 1.0}, comm=0.25)
    table = what_if(tl, chunk_counts=[2, 3, 4, 8])
    assert list(table.columns) == ["schedule", "chunks", "predicted_s", "bubble",
                                   "peak_inflight", "measured_s"]
    # Interleaved needs a multiple of the 2 stages: no 3-chunk row.
    assert sorted(table.loc[table["schedule"] == "interleaved", "chunks"]) == [2, 4, 8]
    own = table[table["measured_s"].notna()]
    assert own[["schedule", "chunks"]].values.tolist() == [["gnnpipe", 4]]
    assert own["predicted_s"].item() == own["measured_s"].item() == tl.makespan()
    zb = table.set_index(["schedule", "chunks"]).loc[("zb-h1", 8)]
    assert zb["predicted_s"] < table.set_index(["schedule", "chunks"]).loc[("1f1b", 8), "predicted_s"]
    assert not math.isnan(zb["bubble"])


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="^timeline: expected a pipeline run's timeline"):
        costs_from(Timeline())
    graph = simulate(schedule.gnnpipe(1, 1), 1.0).df.assign(chunk=-1)
    with pytest.raises(ValueError, match="per-chunk forward and backward"):
        costs_from(Timeline(graph))
    with pytest.raises(ValueError, match="^name: expected one of"):
        build("pipedream", 2, 2)
    assert bubble_formula("gnnpipe", 4, 8) == ("(S−1)/(C+S−1)", 3 / 11)
