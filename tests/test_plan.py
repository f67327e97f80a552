"""gp.plan: the stage DP against brute force, memory limits, the profiler, plans that train."""

from __future__ import annotations

import copy
import gc
import itertools
import math

import numpy as np
import pytest
import torch

import gnnpipe as gp
from gnnpipe.cli import main
from gnnpipe.plan import (
    Profile,
    chunk_candidates,
    memory_costs,
    parse_bytes,
    profile_model,
    split_stages,
)


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
    assert chunk_candidates(2, 1000) == list(range(2, 65, 2))
    three = chunk_candidates(3, 1000)
    assert {4, 8, 16, 32, 64, 3, 6, 63} <= set(three) and min(three) == 3 and max(three) == 64
    assert chunk_candidates(2, 10) == [2, 4, 6, 8, 10]


@pytest.fixture(scope="module")
def model(small_graph):
    torch.manual_seed(0)
    return gp.models.gcnii(small_graph.num_features, hidden=16, out_dim=4, layers=4)


@pytest.fixture(scope="module")
def profile(model, small_graph):
    return profile_model(model, small_graph, chunks=4, repeats=2)


def test_profile_shapes_and_positive_numbers(model, profile):
    assert len(profile.blocks) == len(model) and len(profile.boundary_bytes) == len(model) - 1
    assert profile.num_nodes == 600 and profile.chunk_counts == (4, 16)
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


def test_profiling_leaves_the_model_untouched(model, small_graph):
    before = copy.deepcopy(model.state_dict())
    profile_model(model, small_graph, chunks=4, repeats=1)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


@pytest.fixture(scope="module")
def plan(model, small_graph, profile):
    return gp.plan(model, small_graph, workers=2, profile=profile)


def test_plan_tiles_the_model_and_picks_a_candidate(model, small_graph, plan):
    assert plan.ranges[0][0] == 0 and plan.ranges[-1][1] == len(model)
    assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(plan.ranges, plan.ranges[1:]))
    assert plan.chunks in chunk_candidates(2, small_graph.num_nodes)
    assert plan.epoch_time == pytest.approx(plan.timeline.makespan())
    assert plan.epoch_time <= plan.candidates["epoch_time"].min() * (1 + 1e-9)  # refined or equal
    assert plan.timeline.num_ranks == 2 and len(plan.memory) == 2 and sum(plan.layers) == 4
    text = repr(plan)
    assert "2 stages" in text and "predicted_s" in text and "memory" in text
    uniform = plan.predict([(0, 3), (3, 6)])
    assert uniform.makespan() > 0 and uniform.num_ranks == 2


def test_plan_respects_a_memory_limit(model, small_graph, profile, plan):
    limit = int(max(plan.memory) * 1.05)
    limited = gp.plan(model, small_graph, 2, memory_limit=limit, profile=profile)
    assert max(limited.memory) <= limit and limited.memory_limit == limit
    with pytest.raises(ValueError, match="smallest memory limit that fits"):
        gp.plan(model, small_graph, 2, memory_limit="1kB", profile=profile)


def test_an_impossible_memory_limit_is_refused_before_any_profiling(model, small_graph):
    """The memory model decides first: nothing is profiled (this cluster address does not
    even exist) for a limit no split meets, and the error names the smallest that fits."""
    with pytest.raises(ValueError, match=r"memory_limit: .* too small for 2 stages; the smallest"):
        gp.plan(model, small_graph, 2, memory_limit="1MB", cluster="tcp://127.0.0.1:9")


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
        planned = gp.plan(pyg, small_graph, workers=2, profile=profile)
        assert planned.ranges[-1][1] == len(gp.models.from_pyg(pyg))
        assert memory_costs(pyg, small_graph, 2)[1] > 0
        run = gp.train(pyg, small_graph, "local", plan=planned, epochs=2, progress=False)
        assert [tuple(r) for r in run.config.ranges] == list(planned.ranges)


@pytest.mark.parametrize("kwargs, match", [
    ({"workers": 0}, "workers: expected 1 to 6"),
    ({"workers": 7}, "workers: expected 1 to 6"),
    ({"memory_limit": "plenty"}, "memory_limit: expected a size"),
    ({"bandwidth": "fast"}, "bandwidth: expected a size"),
    ({"chunks": 0}, "chunks: expected counts"),
])
def test_plan_rejects_bad_arguments(model, small_graph, profile, kwargs, match):
    with pytest.raises(ValueError, match=match):
        gp.plan(model, small_graph, **{"workers": 2, "profile": profile, **kwargs})


def test_plan_with_fixed_chunks_and_bandwidth(model, small_graph, profile):
    fixed = gp.plan(model, small_graph, 2, bandwidth="1MB/s", chunks=4, profile=profile)
    assert fixed.chunks == 4 and fixed.bandwidth == 1e6


def test_train_with_a_plan(model, small_graph, plan):
    run = gp.train(copy.deepcopy(model), small_graph, "local", plan=plan, epochs=2, progress=False)
    assert len(run.history) == 2
    assert [tuple(r) for r in run.config.ranges] == list(plan.ranges)
    assert run.config.chunks == plan.chunks


def test_cli_plan_prints_the_plan(capsys):
    assert main(["plan", "--dataset", "synthetic:300", "--model", "gcn", "--layers", "4",
                 "--workers", "2", "--memory-limit", "1GB", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "Plan: 2 stages" in out and "memory limit 1 GB" in out


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
    planned = gp.plan(model, small_graph, 2, cluster=cluster, repeats=1)
    assert planned.ranges[0][0] == 0 and planned.ranges[-1][1] == len(model)
    assert planned.profile.num_nodes == small_graph.num_nodes
    assert all(b.forward_s > 0 and b.backward_s > 0 for b in planned.profile.blocks)


def test_plan_considers_chunk_counts_only_up_to_the_profiled_ones(model, small_graph, profile):
    """Per-row and per-chunk costs are a line through the profile's two chunk counts; the
    default candidates stay within them instead of extrapolating the line."""
    chosen = gp.plan(model, small_graph, workers=2, profile=profile)
    tried = chosen.candidates["chunks"]
    assert tried.max() <= max(profile.chunk_counts) < max(chunk_candidates(2, small_graph.num_nodes))


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
