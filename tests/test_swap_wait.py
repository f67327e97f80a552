"""What a graph rank's halo swaps wait beyond their transfer: measured in a short run on the
plan's cluster when a ``graph`` layout contends, and counted in every ``graph`` prediction."""

from __future__ import annotations

import dataclasses

import pytest

import gnnpipe as gp
from gnnpipe.core.kinds import Mode
from gnnpipe.plan import planner
from gnnpipe.plan.calibrate import measure_swap_wait
from gnnpipe.plan.costs import Network, Shard, graph_epoch, swaps_per_epoch
from gnnpipe.plan.search import Search


def _graph_time(plan: gp.Plan) -> float:
    table = plan.table()
    return float(table[table["mode"] == "graph"]["epoch_time"].min())


def test_every_swap_of_a_graph_epoch_waits_the_measured_wait(small_profile):
    aggregating = sum(b.aggregates for b in small_profile.blocks)
    assert swaps_per_epoch(small_profile, 3) == 2 * aggregating > 0
    assert swaps_per_epoch(small_profile, 1) == 0
    shards = [Shard(300, 1e6), Shard(300, 2e6)]
    net = Network(1e9)
    unmeasured = graph_epoch(small_profile, shards, net)
    unwaited = dataclasses.replace(small_profile, swap_wait=0.0)
    assert graph_epoch(unwaited, shards, net) == unmeasured
    waited = graph_epoch(dataclasses.replace(small_profile, swap_wait=0.01), shards, net)
    assert waited - unmeasured == pytest.approx(0.01 * 2 * aggregating)
    # a negative wait (the run was faster than predicted) takes time off, never below the sends
    less = graph_epoch(dataclasses.replace(small_profile, swap_wait=-1e-6), shards, net)
    assert less - unmeasured == pytest.approx(-1e-6 * 2 * aggregating)
    floor = graph_epoch(dataclasses.replace(small_profile, swap_wait=-1e3), shards, net)
    sends = net.seconds(2e6, 2 * aggregating)
    assert floor == pytest.approx(sends + net.seconds(
        2 * sum(b.param_bytes for b in small_profile.blocks) / 2))


def test_the_wait_is_the_run_beyond_the_prediction_per_swap(cluster, small_gcnii, small_graph,
                                                            small_profile):
    from gnnpipe.analysis.memory import MemoryModel
    from gnnpipe.plan.layout import Layout

    search = Search(small_gcnii, small_graph, small_profile,
                    MemoryModel(small_gcnii, small_graph), Network(1e9), None, 16)
    job = search.job(Layout(Mode.GRAPH, parts=2))
    swaps = swaps_per_epoch(small_profile, 2)
    # predicted to take no time: every second of the epochs is waiting
    whole = measure_swap_wait(cluster, small_gcnii, small_graph, job, small_profile,
                              0.0).swap_wait
    assert whole is not None and 0 < whole * swaps < 10.0
    # predicted slower than it runs: the wait is negative, what the prediction over-counts
    over = measure_swap_wait(cluster, small_gcnii, small_graph, job, small_profile,
                             1e6).swap_wait
    assert over is not None and -1e6 < over * swaps < -1e6 + 10.0
    assert small_profile.swap_wait is None  # the given profile is left as it was


def test_a_plan_measures_the_wait_once_and_keeps_it(cluster, small_gcnii, small_graph, tmp_path):
    planned = gp.plan(small_gcnii, small_graph, 2, cluster=cluster, repeats=1,
                      modes=["graph"])
    wait = planned.profile.swap_wait
    assert wait is not None and "swap_wait" in planned.seconds
    # the wait is in every graph prediction: the same profile without it predicts less
    unmeasured = dataclasses.replace(planned.profile, swap_wait=0.0)
    again = gp.plan(small_gcnii, small_graph, 2, profile=unmeasured, modes=["graph"])
    assert _graph_time(planned) - _graph_time(again) == pytest.approx(
        wait * swaps_per_epoch(planned.profile, 2))
    # a profile that has it is not measured again, and a saved plan keeps it
    kept = gp.plan(small_gcnii, small_graph, 2, cluster=cluster, profile=planned.profile,
                   modes=["graph"])
    assert "swap_wait" not in kept.seconds and _graph_time(kept) == _graph_time(planned)
    path = planned.to_json(tmp_path / "plan.json")
    assert gp.Plan.from_json(path).profile.swap_wait == wait


def test_no_wait_is_measured_where_no_graph_layout_contends(cluster, small_gcnii, small_graph,
                                                             small_profile, monkeypatch):
    monkeypatch.setattr(planner, "CONTENDS", 0.0)  # no graph layout is ever close enough
    planned = gp.plan(small_gcnii, small_graph, 2, cluster=cluster, profile=small_profile,
                      modes=["graph", "single"])
    assert planned.profile.swap_wait is None and "swap_wait" not in planned.seconds


def test_a_failed_measuring_run_leaves_the_waits_uncounted(cluster, small_gcnii, small_graph,
                                                           small_profile, monkeypatch, caplog):
    def fails(*args, **kwargs):
        raise RuntimeError("rank 1 failed: its worker process died")

    monkeypatch.setattr(planner, "measure_swap_wait", fails)
    planned = gp.plan(small_gcnii, small_graph, 2, cluster=cluster, profile=small_profile,
                      modes=["graph"])
    assert planned.mode is Mode.GRAPH and planned.profile.swap_wait is None
    assert "its waits are not counted: rank 1 failed" in caplog.text
