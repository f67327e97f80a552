"""gp.plan: the stage DP against brute force, memory limits, the profiler, plans that train."""

from __future__ import annotations

import copy
import dataclasses
import gc
import itertools
import math
import re

import numpy as np
import pytest
import torch

import gnnpipe as gp
from gnnpipe.core.kinds import Mode
from gnnpipe.plan import (
    Plan,
    Profile,
    chunk_candidates,
    memory_costs,
    parse_bytes,
    profile_model,
    split_stages,
)
from gnnpipe.plan.planner import TIE


def _splits(n: int, stages: int):
    for cuts in itertools.combinations(range(1, n), stages - 1):
        edges = (0, *cuts, n)
        yield list(itertools.pairwise(edges))


def _stage_time(costs, boundary, a: int, b: int) -> float:
    """Stage ``[a, b)``: its blocks plus the transfers at both of its cuts (computed directly)."""
    return (sum(costs[a:b]) + (boundary[a - 1] if a > 0 else 0.0)
            + (boundary[b - 1] if b < len(costs) else 0.0))


def _brute(costs, memory, boundary, stages, limit):
    """(smallest bottleneck over feasible splits or None, smallest max stage memory)."""
    best, least = None, math.inf
    for ranges in _splits(len(costs), stages):
        mems = [sum(memory[a:b]) for a, b in ranges]
        least = min(least, max(mems))
        if limit is not None and max(mems) > limit:
            continue
        neck = max(_stage_time(costs, boundary, a, b) for a, b in ranges)
        best = neck if best is None else min(best, neck)
    return best, least


def test_split_stages_equals_brute_force_on_random_vectors():
    rng = np.random.default_rng(0)
    feasible = infeasible = 0
    for _ in range(200):
        n = int(rng.integers(1, 11))
        stages = int(rng.integers(1, min(4, n) + 1))
        costs = rng.exponential(1.0, n).tolist()
        memory = rng.integers(1, 100, n).tolist()
        boundary = (rng.exponential(0.3, n - 1) * rng.integers(0, 2)).tolist()
        limit = None if rng.random() < 0.2 else int(rng.integers(sum(memory) // 4 + 1,
                                                                   sum(memory) + 1))
        best, least = _brute(costs, memory, boundary, stages, limit)
        if best is None:
            infeasible += 1
            with pytest.raises(ValueError, match=f"smallest memory limit that fits is .*{least:,}"):
                split_stages(costs, memory, boundary, stages, limit)
            continue
        feasible += 1
        ranges = split_stages(costs, memory, boundary, stages, limit)
        assert ranges in list(_splits(n, stages))  # contiguous, non-empty, tiling
        if limit is not None:
            assert all(sum(memory[a:b]) <= limit for a, b in ranges)
        neck = max(_stage_time(costs, boundary, a, b) for a, b in ranges)
        assert neck == pytest.approx(best, rel=1e-9)
    assert feasible > 100 and infeasible > 5  # both branches were exercised


def test_memory_limit_moves_the_boundary():
    costs, memory = [1.0, 1.0, 1.0, 1.0], [10, 10, 10, 40]
    assert split_stages(costs, memory, [0.0] * 3, 2) == [(0, 2), (2, 4)]
    # with 45 bytes the last stage can only hold block 3 alone
    assert split_stages(costs, memory, [0.0] * 3, 2, memory_limit=45) == [(0, 3), (3, 4)]


def test_boundary_costs_pick_the_cheap_cut():
    costs = [1.0] * 4
    assert split_stages(costs, [1] * 4, [0.0, 5.0, 0.0], 2) in ([(0, 1), (1, 4)], [(0, 3), (3, 4)])
    assert split_stages(costs, [1] * 4, [0.0, 0.0, 0.0], 2) == [(0, 2), (2, 4)]


def test_infeasible_limit_names_the_smallest_that_fits():
    with pytest.raises(ValueError, match=r"memory_limit: .*too small.*smallest memory limit that "
                                         r"fits is 60 B \(60 bytes\)"):
        split_stages([1.0, 1.0, 1.0], [30, 30, 60], [0.0, 0.0], 2, memory_limit=50)


@pytest.mark.parametrize("kwargs, match", [
    ({"stages": 0}, "stages: expected 1 to 3"),
    ({"stages": 4}, "stages: expected 1 to 3"),
    ({"memory": [1, 2]}, "memory, boundary_costs"),
])
def test_split_stages_rejects_bad_arguments(kwargs, match):
    args = {"costs": [1.0] * 3, "memory": [1] * 3, "boundary_costs": [0.0] * 2, "stages": 2}
    with pytest.raises(ValueError, match=match):
        split_stages(**{**args, **kwargs})


@pytest.mark.parametrize("value, expected", [
    ("8GB", 8 * 10**9), ("512MiB", 512 * 2**20), ("1.5 GiB", int(1.5 * 2**30)), ("100", 100),
    ("2kb", 2000), (4096, 4096), (1e9, 10**9),
])
def test_parse_bytes(value, expected):
    assert parse_bytes(value) == expected


@pytest.mark.parametrize("value", ["lots", "8 GBs", "", "-1GB", "0", "GB", 0, -5])
def test_parse_bytes_rejects_bad_values(value):
    with pytest.raises(ValueError, match="memory_limit"):
        parse_bytes(value)


def test_parse_bytes_rejects_other_types():
    with pytest.raises(TypeError, match="memory_limit"):
        parse_bytes([8])


def test_chunk_candidates():
    assert chunk_candidates(2, 1000, 64) == [2, 4, 8, 16, 32]
    assert chunk_candidates(3, 1000, 64) == [3, 6, 12, 24, 48]
    assert chunk_candidates(2, 10, 64) == [2, 4, 8]
    assert chunk_candidates(4, 1000, 10) == [4, 8]


@pytest.fixture(scope="session")
def model(small_gcnii):
    return small_gcnii


@pytest.fixture(scope="session")
def profile(small_profile):
    return small_profile


def test_profile_shapes_and_positive_numbers(model, profile):
    assert len(profile.blocks) == len(model) and len(profile.boundary_bytes) == len(model) - 1
    # measured at 4 chunks and a 32-row one: the line reaches 600 // 32 = 18 chunks
    assert profile.num_nodes == 600 and profile.chunk_counts == (4, 18)
    for cost, block in zip(profile.blocks, model.blocks):
        for value in (cost.forward_s, cost.backward_s, cost.step_s, cost.activation_bytes):
            assert value > 0
        assert cost.forward_fixed_s >= 0 and cost.backward_fixed_s >= 0
        params = sum(p.numel() * 4 for p in block.parameters())
        assert cost.param_bytes == params and cost.optimizer_bytes == 2 * params
        # Hbuf, its snapshot and dZbuf per graph row (the default techniques: unbiased gradients
        # off since issue #28, so dZbuf has memory of its own)
        assert cost.buffer_bytes == (3 * block.out_dim * 4 if block.aggregates else 0)
    assert profile.boundary_bytes[0] == (16 + 16) * 4  # GCNII ships h0 beside h
    assert profile.boundary_bytes[-1] == 16 * 4  # the classifier needs h only
    assert profile.chunk_overhead > 0
    assert list(profile.to_frame().index) == list(range(len(model)))


def test_per_row_and_per_chunk_costs_solve_the_two_op_sizes():
    """``t = rows·a + b``: 4 ops over 968 rows and one of 32 rows give ``a`` and ``b`` back."""
    from gnnpipe.plan.bench import bench_bounds, tiny_rows
    from gnnpipe.plan.profile import _per_row_and_chunk

    a, b = 2e-6, 3e-4
    assert tiny_rows(1000) == 32 and tiny_rows(60) == 3
    total, tiny = 968 * a + 4 * b, 32 * a + b
    assert _per_row_and_chunk(total, tiny, 4, 968, 32) == pytest.approx((a, b))
    # 8 chunks: the first four merged into one, 32 rows carved off the last
    assert bench_bounds([0, 10, 20, 30, 40, 50, 60, 70, 80], 1000) == (
        [0, 40, 50, 60, 70, 80 - 32, 80], 4)
    assert bench_bounds([0, 500, 1000], 1000) == ([0, 500, 1000 - 32, 1000], 0)
    # under a memory limit nothing is merged: no chunk of half the graph
    assert bench_bounds([0, 10, 20, 30, 40], 1000, merge=False) == ([0, 10, 20, 30, 40 - 32, 40], 0)


def test_profiling_leaves_the_model_untouched(model, small_graph):
    before = copy.deepcopy(model.state_dict())
    profile_model(model, small_graph, chunks=4, repeats=1)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


@pytest.fixture(scope="module")
def plan(model, small_graph, profile):
    return gp.plan(model, small_graph, workers=4, profile=profile)


def test_a_plan_weighs_every_mode_and_ranks_them(model, small_graph, plan):
    table = plan.table()
    required = {"mode", "stages", "ways", "parts", "chunks", "epoch_time", "peak_bytes",
                "comm_bytes", "fits", "reason"}
    assert required <= set(table.columns)
    assert set(table["mode"]) == {"single", "pipeline", "graph", "hybrid"}
    # 1 single, pipelines of 2-4 stages in two schedules, graphs of 2-4 parts, one hybrid 2 x 2
    assert len(table) == 1 + 3 * 2 + 3 + 1
    assert table["chosen"].tolist() == [True] + [False] * (len(table) - 1)
    # the pick ties the fastest (within TIE) and needs the least memory of those that do; the
    # others follow fastest first
    fastest = table["epoch_time"].min()
    tied = table[table["epoch_time"] <= fastest * (1 + TIE)]
    assert table["epoch_time"].iloc[0] <= fastest * (1 + TIE)
    assert table["peak_bytes"].iloc[0] == tied["peak_bytes"].min()
    assert table["epoch_time"].iloc[1:].is_monotonic_increasing
    assert table["epoch_time"].iloc[0] == plan.epoch_time
    assert all(table["reason"].iloc[1:].str.contains("slower|ties"))
    assert plan.mode.value == table["mode"].iloc[0] and plan.workers == 4
    assert max(plan.peak_bytes) == table["peak_bytes"].iloc[0]
    hybrid = table[table["mode"] == "hybrid"].iloc[0]
    assert (hybrid["ways"], hybrid["stages"], hybrid["chunks"] % 2) == (2, 2, 0)
    # no memory limit: nothing that only saves memory is weighed
    assert not table["recompute"].any() and set(table["history_dtype"]) == {"float32"}


def test_each_candidates_bytes_and_memory_are_what_the_models_say(model, small_graph, plan):
    """A candidate's bytes are ``gp.comm_volume``'s and its memory ``gp.estimate_memory``'s for
    that layout."""
    for _, row in plan.table().iterrows():
        mode = row["mode"]
        shape = {"graph": {"parts": row["parts"]}, "single": {},
                 "pipeline": {"stages": row["stages"], "chunks": row["chunks"]},
                 "hybrid": {"stages": row["stages"], "ways": row["ways"],
                            "chunks": row["chunks"]}}[mode]
        ranges = [tuple(r) for r in row["ranges"]]
        assert row["comm_bytes"] == gp.comm_volume(model, small_graph, mode, ranges=ranges,
                                                   **shape)
        if mode in ("single", "graph"):
            need = gp.estimate_memory(model, small_graph, mode, **shape)
            assert row["peak_bytes"] == need["peak_bytes"].max()
    need = gp.estimate_memory(model, small_graph, plan=plan)
    assert tuple(need["peak_bytes"]) == plan.peak_bytes


def test_a_tie_goes_to_the_layout_needing_less_memory():
    """Epochs predicted within TIE of the fastest tie, and the tie goes to the smallest largest
    rank; a clear gain is taken whatever it holds."""
    from gnnpipe.core.kinds import TrainSchedule
    from gnnpipe.plan.layout import Layout
    from gnnpipe.plan.planner import _rank
    from gnnpipe.plan.search import Candidate

    def pipeline(schedule: TrainSchedule, seconds: float, peak: int) -> Candidate:
        layout = Layout(Mode.PIPELINE, stages=2, chunks=8, ranges=((0, 3), (3, 6)),
                        schedule=schedule)
        return Candidate(layout, seconds, (peak, peak // 2), 10)

    fill = pipeline(TrainSchedule.GNNPIPE, 1.0, 300)
    lean = pipeline(TrainSchedule.ONE_F_ONE_B, 1.0 + TIE * 0.9, 200)
    chosen, table = _rank([fill, lean], None)
    assert chosen is lean and table["chosen"].tolist() == [True, False]
    assert table["reason"].iloc[1].startswith("ties: predicted epoch 0.98x")
    slow = pipeline(TrainSchedule.ONE_F_ONE_B, 1.0 + TIE * 1.1, 200)
    chosen, table = _rank([slow, fill], None)
    assert chosen is fill and table["reason"].iloc[1].startswith("slower")


def test_a_pipeline_plan_tiles_the_model(model, small_graph, profile):
    piped = gp.plan(model, small_graph, workers=2, profile=profile, modes=["pipeline"])
    assert piped.mode is Mode.PIPELINE and len(piped.ranges) == 2
    assert piped.ranges[0][0] == 0 and piped.ranges[-1][1] == len(model)
    assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(piped.ranges, piped.ranges[1:]))
    assert piped.chunks in chunk_candidates(2, small_graph.num_nodes, 18)
    assert piped.epoch_time == pytest.approx(piped.timeline.makespan())
    assert piped.timeline.num_ranks == 2 and len(piped.memory) == 2 and sum(piped.layers) == 4
    text = repr(piped)
    assert "pipeline 2 x" in text and "predicted_s" in text and "memory" in text
    uniform = piped.predict([(0, 3), (3, 6)])
    assert uniform.makespan() > 0 and uniform.num_ranks == 2
    assert set(piped.table()["schedule"]) == {"gnnpipe", "1f1b"}
    only = gp.plan(model, small_graph, 2, profile=profile, modes="pipeline", schedules="gnnpipe")
    assert set(only.table()["schedule"]) == {"gnnpipe"}


def test_plan_respects_a_memory_limit(model, small_graph, profile):
    """Under a limit recompute and 16-bit layouts are weighed too, the chosen one fits, and a
    16-bit one is chosen only when no float32 one fits (unless compact=True)."""
    # single needs least of all here; no headroom: the estimates may reach the limit itself
    piped = {"profile": profile, "modes": ["pipeline"], "headroom": 0}
    everything = gp.plan(model, small_graph, 2, memory_limit="10GB", compact=True, **piped)
    table = everything.table()
    assert table["recompute"].any() and set(table["history_dtype"]) == {"float32", "bfloat16"}
    with pytest.raises(ValueError, match="too small for every layout") as refused:
        gp.plan(model, small_graph, 2, memory_limit="1MB", compact=False, **piped)
    least32 = int(re.search(r"can need is .*? \(([\d,]+) bytes\)", str(refused.value))
                  .group(1).replace(",", ""))
    tight = gp.plan(model, small_graph, 2, memory_limit=least32 - 1, **piped)
    assert tight.layout.compact and max(tight.peak_bytes) <= least32 - 1 == tight.memory_limit
    assert not tight.table().loc[~tight.table()["fits"], "chosen"].any()
    with pytest.raises(ValueError, match="too small for every layout"):
        gp.plan(model, small_graph, 2, memory_limit=least32 - 1, compact=False, **piped)
    roomy = gp.plan(model, small_graph, 2, memory_limit=least32 * 2, **piped)
    assert not roomy.layout.compact and max(roomy.peak_bytes) <= least32 * 2
    assert roomy.table()["reason"].str.contains("16-bit values, not needed").any()


def test_a_plan_keeps_headroom_under_a_memory_limit(model, small_graph, profile, tmp_path):
    """By default every rank's estimate fits 85% of memory_limit: a limit whose whole a layout
    fits but whose 85% none does is refused, naming the headroom; headroom=0 plans up to it."""
    piped = {"profile": profile, "modes": ["pipeline"], "compact": False}
    with pytest.raises(ValueError, match="too small for every layout") as refused:
        gp.plan(model, small_graph, 2, memory_limit="1MB", headroom=0, **piped)
    least = int(re.search(r"can need is .*? \(([\d,]+) bytes\)", str(refused.value))
                .group(1).replace(",", ""))
    limit = int(least / 0.95)
    with pytest.raises(ValueError, match=r"too small for every layout on 2 worker\(s\) \(with "
                                         r"headroom=0.15: .* of it may be planned\)"):
        gp.plan(model, small_graph, 2, memory_limit=limit, **piped)
    exact = gp.plan(model, small_graph, 2, memory_limit=limit, headroom=0, **piped)
    assert max(exact.peak_bytes) <= limit and exact.headroom == 0
    # a limit whose 85% the least need just fits (the layouts that need more do not)
    roomy = gp.plan(model, small_graph, 2, memory_limit=int(least / 0.85) + 2, **piped)
    budget = int((int(least / 0.85) + 2) * 0.85)
    table = roomy.table()
    assert roomy.headroom == 0.15 and max(roomy.peak_bytes) <= budget
    assert (table["fits"] == (table["peak_bytes"] <= budget)).all() and not table["fits"].all()
    assert table.loc[~table["fits"], "reason"].str.contains("over the memory limit").all()
    assert "15% kept free" in repr(roomy)
    assert Plan.from_json(roomy.to_json(tmp_path / "plan.json")).headroom == 0.15
    for bad in (1.0, -0.1, "10%"):
        with pytest.raises(ValueError, match=r"headroom: expected a share of memory_limit in "
                                             r"\[0, 1\)"):
            gp.plan(model, small_graph, 2, memory_limit=limit, headroom=bad, **piped)


def test_an_impossible_memory_limit_is_refused_before_any_profiling(model, small_graph):
    """The memory model decides first: nothing is profiled (this cluster address does not
    even exist) for a limit no layout meets, and the error names the least any rank needs."""
    with pytest.raises(ValueError, match=r"memory_limit: .* too small for every layout on 2 "
                                         r"worker\(s\) \(with headroom=0.15: 850 kB of it may be "
                                         r"planned\); the least any rank can need is"):
        gp.plan(model, small_graph, 2, memory_limit="1MB", cluster="tcp://127.0.0.1:9")


def test_a_profile_is_reused_for_another_limit_or_worker_count(model, small_graph, plan):
    again = gp.plan(model, small_graph, workers=3, profile=plan.profile)
    assert again.profile is plan.profile and again.workers == 3
    assert set(again.table()["workers"]) <= {1, 2, 3}


def test_plan_takes_the_pyg_models_train_takes(small_graph):
    from torch import nn
    from torch_geometric.nn import GCNConv, Sequential
    from torch_geometric.nn.models import GraphSAGE

    torch.manual_seed(0)
    seq = Sequential("x, edge_index", [
        (GCNConv(small_graph.num_features, 16), "x, edge_index -> x"), nn.ReLU(),
        (GCNConv(16, 16), "x, edge_index -> x"), nn.ReLU(),
        (GCNConv(16, 4), "x, edge_index -> x")])
    for pyg in (seq, GraphSAGE(small_graph.num_features, 16, num_layers=3, out_channels=4)):
        profile = profile_model(pyg, small_graph, chunks=4, repeats=1)
        planned = gp.plan(pyg, small_graph, workers=2, profile=profile, modes=["pipeline"])
        assert planned.ranges[-1][1] == len(gp.models.from_pyg(pyg))
        assert memory_costs(pyg, small_graph, 2)[1] > 0
        run = gp.train(pyg, small_graph, "local", plan=planned, epochs=2, progress=False)
        assert [tuple(r) for r in run.config.ranges] == list(planned.ranges)


def test_plan_leaves_out_the_modes_train_refuses_the_model(small_graph, caplog):
    """A GAT that drops out inside its layers cannot run in ``graph`` mode (gp.train refuses
    it): the planner weighs only the modes gp.train runs it in, and refuses where none is left,
    before any worker starts."""
    from torch_geometric.nn.models import GAT

    torch.manual_seed(0)
    gat = GAT(small_graph.num_features, 16, 2, out_channels=4, heads=2, dropout=0.5)
    with pytest.raises(ValueError, match=r"modes: gp.train runs the model in none of them: graph "
                                         r"\(model.convs.0: drops out inside the layer"):
        gp.plan(gat, small_graph, workers=2, modes=["graph"], cluster="tcp://127.0.0.1:9")
    profile = profile_model(gat, small_graph, chunks=4, repeats=1)
    with caplog.at_level("WARNING", logger="gnnpipe.plan.planner"):
        planned = gp.plan(gat, small_graph, workers=2, profile=profile)
    assert set(planned.table()["mode"]) == {"single", "pipeline"}
    assert "plan: mode graph (model.convs.0: drops out inside the layer" in caplog.text
    gp.train(gat, small_graph, plan=planned, mode="local" if planned.mode == "pipeline" else None,
             epochs=1, progress=False)


@pytest.mark.parametrize("kwargs, match", [
    ({"workers": 0}, "workers: expected a positive integer"),
    ({"memory_limit": "plenty"}, "memory_limit: expected a size"),
    ({"bandwidth": "fast"}, "bandwidth: expected bytes per second such as '1GB/s'"),
    ({"chunks": 0}, "chunks: expected a positive integer"),
    ({"chunks": 601}, "chunks: expected at most 600"),
    ({"modes": ["local"]}, "modes: expected some of"),
    ({"modes": ["hybrid"]}, "modes: hybrid has no layout on 2 worker"),
    ({"schedules": ["gpipe"]}, "schedules: expected one of"),
])
def test_plan_rejects_bad_arguments(model, small_graph, profile, kwargs, match):
    with pytest.raises(ValueError, match=match):
        gp.plan(model, small_graph, **{"workers": 2, "profile": profile, **kwargs})


def test_plan_with_fewer_chunks_and_a_bandwidth(model, small_graph, profile):
    fixed = gp.plan(model, small_graph, 2, bandwidth="1MB/s", chunks=4, profile=profile,
                    modes=["pipeline", "hybrid"])
    assert fixed.chunks <= 4 and fixed.bandwidth == 1e6
    assert fixed.table()["chunks"].max() <= 4


@pytest.mark.parametrize("mode", ["single", "pipeline", "graph", "hybrid"])
def test_train_runs_a_plan_of_each_mode(cluster, model, small_graph, profile, mode):
    """``gp.train(model, data, plan=plan)``: the plan's mode and whole layout, and its
    prediction beside the measured figures."""
    planned = gp.plan(model, small_graph, workers=4, profile=profile, modes=[mode])
    run = gp.train(copy.deepcopy(model), small_graph, plan=planned, epochs=2, cluster=cluster,
                   progress=False)
    layout = planned.layout
    job = run.config
    assert (job.mode, job.ways, job.chunks) == (layout.mode, layout.ways, layout.chunks)
    assert job.world == layout.workers and job.schedule is layout.schedule
    if mode == "graph":
        assert job.parts == layout.parts
    else:
        assert [tuple(r) for r in job.ranges] == list(layout.ranges)
    assert run.prediction is not None and run.prediction.epoch_time == planned.epoch_time
    row = run.summary().iloc[0]
    assert row["predicted_epoch_time_s"] == planned.epoch_time
    assert row["epoch_time_ratio"] == pytest.approx(row["epoch_time_s"] / planned.epoch_time)
    assert row["predicted_peak_bytes"] == max(planned.peak_bytes)
    if mode != "single":
        assert run.history["comm_bytes"].iloc[-1] == planned.comm_bytes


def test_a_plans_memory_limit_reaches_the_ranks(cluster, model, small_graph, profile):
    """A plan made under a memory_limit reaches the ranks gp.train starts for it: each trims
    its heap past 80% of the limit above what it held once the graph arrived (every rank trims
    under a 1-byte limit); under a plan without a limit no rank trims."""
    planned = gp.plan(model, small_graph, workers=2, profile=profile, modes=["pipeline"],
                      schedules=["gnnpipe"])
    assert planned.memory_limit is None
    free = gp.train(copy.deepcopy(model), small_graph, plan=planned, epochs=2, cluster=cluster,
                    progress=False)
    assert free.launch.plan_memory_limit is None and (free.memory()["heap_trims"] == 0).all()
    capped = dataclasses.replace(planned, memory_limit=1)
    run = gp.train(copy.deepcopy(model), small_graph, plan=capped, epochs=2, progress=False)
    assert run.launch.plan_memory_limit == 1 == run.prediction.memory_limit
    assert len(run.memory()) == 2 and (run.memory()["heap_trims"] >= 1).all()


def test_train_refuses_arguments_a_plan_sets_otherwise(model, small_graph, profile):
    planned = gp.plan(model, small_graph, workers=2, profile=profile, modes=["graph"])
    with pytest.raises(ValueError, match="mode: the plan is for mode 'graph'"):
        gp.train(model, small_graph, "pipeline", plan=planned, epochs=1)
    with pytest.raises(ValueError, match="parts: the plan sets parts=2"):
        gp.train(model, small_graph, plan=planned, parts=3, epochs=1)
    with pytest.raises(TypeError, match="plan: expected a gp.Plan"):
        gp.train(model, small_graph, plan={"mode": "graph"}, epochs=1)


def test_a_candidate_of_the_table_is_a_plan_of_its_own(model, small_graph, plan):
    table = plan.table()
    assert plan.candidate(0).layout == plan.layout
    runner_up = plan.candidate(1)
    assert runner_up.layout.describe() == table["layout"].iloc[1]
    assert runner_up.epoch_time == table["epoch_time"].iloc[1]
    assert max(runner_up.peak_bytes) == table["peak_bytes"].iloc[1]
    run = gp.train(copy.deepcopy(model), small_graph, plan=plan.candidate(
        int(table.index[table["mode"] == "single"][0])), epochs=1, progress=False)
    assert run.config.mode is Mode.SINGLE


def test_a_plan_round_trips_through_json(plan, tmp_path):
    back = Plan.from_json(plan.to_json(tmp_path / "plan.json"))
    assert back.layout == plan.layout and back.epoch_time == plan.epoch_time
    assert back.peak_bytes == plan.peak_bytes and back.comm_bytes == plan.comm_bytes
    assert back.table()["layout"].tolist() == plan.table()["layout"].tolist()


def test_profile_of_slices_joins_into_a_whole(model, small_graph):
    halves = [profile_model(model, small_graph, chunks=4, blocks=r, repeats=1)
              for r in ((0, 3), (3, len(model)))]
    whole = Profile.join(halves)
    assert [b.index for b in whole.blocks] == list(range(len(model)))
    assert [b.param_bytes for b in whole.blocks] == [
        sum(p.numel() * 4 for p in block.parameters()) for block in model.blocks]
    with pytest.raises(ValueError, match="consecutive block ranges"):
        Profile.join(halves[::-1])
    with pytest.raises(ValueError, match="blocks: expected a range"):
        profile_model(model, small_graph, blocks=(3, 3))


def test_plan_profiles_on_the_cluster_workers(cluster, model, small_graph):
    planned = gp.plan(model, small_graph, 2, cluster=cluster, repeats=1, modes=["pipeline"])
    assert planned.ranges[0][0] == 0 and planned.ranges[-1][1] == len(model)
    assert planned.profile.num_nodes == small_graph.num_nodes
    assert all(b.forward_s > 0 and b.backward_s > 0 for b in planned.profile.blocks)


def test_a_limited_plan_profiles_a_quarter_of_a_workers_blocks_at_a_time(cluster, model,
                                                                          small_graph):
    """Under a memory limit each worker profiles its blocks in ranges, one after another, lean
    (no merged chunk: no exact-scale costs); the joined profile has every block in order."""
    from gnnpipe.plan.profile import profile_on_workers
    from gnnpipe.runtime.together import LINGER_LIMIT_S

    pieces = profile_on_workers(cluster, 2, model, small_graph, 8, pieces=4, repeats=1,
                                lean=True)
    assert [b.index for b in pieces.blocks] == list(range(len(model)))
    assert all(b.forward_s > 0 and b.exact_forward_s == 0 for b in pieces.blocks)
    # a hang guard, not a speed claim: a piece run before another of its worker's that waited
    # for it would sit out the whole limit (the deadlock this caught took 600 s)
    assert pieces.seconds < LINGER_LIMIT_S
    planned = gp.plan(model, small_graph, 2, cluster=cluster, repeats=1, memory_limit="10GB",
                      modes=["pipeline"])
    assert [b.index for b in planned.profile.blocks] == list(range(len(model)))
    assert all(b.exact_forward_s == 0 for b in planned.profile.blocks)


@pytest.mark.parametrize("workers, cores, threads, at_once", [
    (4, 2, 1, 2), (4, 0, 1, 4), (2, 2, 2, 1), (1, 8, 1, 1), (4, 8, 2, 4), (3, 1, 4, 1)])
def test_no_more_workers_profile_at_once_than_the_host_has_cores(workers, cores, threads,
                                                                 at_once):
    from gnnpipe.plan.profile import _at_once

    assert _at_once(workers, cores, threads) == at_once


def test_a_profile_for_more_ranks_than_cores_is_timed_on_as_many_as_the_cores(
        cluster, model, small_graph, monkeypatch):
    """Four workers on fewer cores would each time a share of a core: the profile runs on as
    many workers as the host's cores hold (two here, whatever this machine has), each timing
    its share of the stages, and records how many ran at once so that costs scale to the four
    ranks."""
    from gnnpipe.plan import profile as profiling

    assert profiling._shared_cores(cluster.client, cluster.workers()) >= 1  # one host: known
    monkeypatch.setattr(profiling, "_shared_cores", lambda client, addresses: 2)
    four = profiling.profile_on_workers(cluster, 4, model, small_graph, 8, repeats=1)
    assert [b.index for b in four.blocks] == list(range(len(model)))
    assert (four.threads, four.cores, four.concurrent) == (1, 2, 2)
    assert four.slowdown(2) == pytest.approx(1.0)
    assert four.slowdown(4) >= 2.0  # four ranks take turns on the two cores


def test_one_process_alone_gains_less_over_whole_graph_ops_than_over_chunks(profile):
    """``single`` runs whole-graph ops, which share a host's memory bandwidth at less cost than
    chunk ops: alone on a profile's 2 busy cores it is predicted faster by that smaller share."""
    from gnnpipe.plan.costs import single_epoch
    from gnnpipe.plan.profile import EXACT_SHARED_BANDWIDTH, SHARED_BANDWIDTH

    shared = dataclasses.replace(profile, concurrent=2, cores=2, threads=1)
    assert shared.slowdown(1) == pytest.approx(1 / (1 + SHARED_BANDWIDTH))
    assert shared.slowdown(1, exact=True) == pytest.approx(1 / (1 + EXACT_SHARED_BANDWIDTH))
    assert shared.slowdown(2, exact=True) == shared.slowdown(2) == pytest.approx(1.0)
    assert single_epoch(shared) == pytest.approx(single_epoch(profile) * shared.slowdown(1, True))


def test_plan_considers_chunk_counts_only_up_to_the_profiled_reach(model, small_graph, profile):
    """Per-row and per-chunk costs are a line through the profile's chunk sizes; candidates
    stay within it instead of extrapolating the line."""
    chosen = gp.plan(model, small_graph, workers=2, profile=profile)
    assert chosen.table()["chunks"].max() <= max(profile.chunk_counts)


def test_profile_frees_what_it_allocated(model, small_graph):
    """Nothing of a profile outlives it (its memory-probing forward once kept every buffer
    alive through a cycle in autograd's graph: ~0.5 GB per profile on a 50K-node worker)."""
    from gnnpipe.engine.buffers import LayerBuffers
    from gnnpipe.engine.chunked import StageExecutor

    def alive() -> int:
        gc.collect()
        return sum(type(o) in (LayerBuffers, StageExecutor) for o in gc.get_objects())

    before = alive()
    profile_model(model, small_graph, chunks=4, repeats=1)
    assert alive() == before


def test_a_planned_split_is_never_predicted_slower_than_the_even_split_that_fits(
        model, small_graph, profile):
    """Under a memory limit the stage split's search prices a stage by its blocks' bound,
    which may refuse the even split where its estimate fits: the even split is weighed too, so
    the pick is never predicted slower than an even split that fits (at a limit the even
    split's estimate meets exactly, and with more room)."""
    from gnnpipe.analysis.memory import MemoryModel
    from gnnpipe.engine.local import stage_ranges
    from gnnpipe.plan.costs import Network
    from gnnpipe.plan.search import Search

    even = tuple(stage_ranges(model, 2))
    base = gp.plan(model, small_graph, 2, profile=profile, modes=["pipeline"], compact=False,
                   schedules="gnnpipe")
    search = Search(model, small_graph, profile, MemoryModel(model, small_graph, 0),
                    Network(base.bandwidth, base.latency), None, 64)
    need = max(search.peaks(dataclasses.replace(base.layout, ranges=even)))
    even_epoch = base.predict(even).makespan()  # base's chunks and options: it fits by estimate
    for room in (1.0, 1.2):
        planned = gp.plan(model, small_graph, 2, profile=profile, modes=["pipeline"],
                          compact=False, schedules="gnnpipe", chunks=base.chunks,
                          memory_limit=math.ceil(need * room / 0.85))
        assert planned.epoch_time <= even_epoch * (1 + 1e-9), (room, planned.ranges)
