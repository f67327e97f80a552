"""Distributed modes on real Dask workers: equivalence with the one-process engines and
byte counters equal to the formulas."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from failing_blocks import check_subnormals

import gnnpipe as gp
from gnnpipe.plan import profile_model

EPOCHS = 10


def _rel(a, b) -> float:
    a, b = torch.tensor(a.to_numpy()), torch.tensor(b.to_numpy())
    return float(((a - b).abs() / b.abs()).max())


def _training_bytes(run) -> int:
    kinds = ["activation", "gradient", "halo", "halo_grad", "boundary", "boundary_grad"]
    return int(run.comm[run.comm["kind"].isin(kinds)]["bytes"].sum())


@pytest.fixture(scope="module")
def gcnii(small_graph):
    return gp.models.gcnii(small_graph.num_features, hidden=16, out_dim=4, layers=6, dropout=0.3)


def test_pipeline_equals_local_with_dropout(cluster, small_graph, gcnii):
    local = gp.train(copy.deepcopy(gcnii), small_graph, "local", stages=2, chunks=8,
                     epochs=EPOCHS, progress=False)
    pipe = gp.train(copy.deepcopy(gcnii), small_graph, "pipeline", stages=2, chunks=8,
                    epochs=EPOCHS, cluster=cluster, progress=False)
    assert len(pipe.history) == EPOCHS
    assert _rel(pipe.history["loss"], local.history["loss"]) < 1e-5
    assert pipe.history["val_acc"].tolist() == local.history["val_acc"].tolist()
    predicted = gp.comm_volume(gcnii, small_graph, "pipeline", stages=2)
    assert (pipe.history["comm_bytes"] == predicted).all()
    assert _training_bytes(pipe) == EPOCHS * predicted


def test_pipeline_upkeep_between_phases_equals_local(cluster, small_graph, gcnii):
    """Stages other than the last reset Hbuf, take snapshots and zero dZbuf between their
    forward and backward phases; with a snapshot every 2nd epoch both branches run."""
    kwargs = {"stages": 3, "chunks": 6, "epochs": 6, "techniques": {"snapshot_period": 2},
              "progress": False}
    local = gp.train(copy.deepcopy(gcnii), small_graph, "local", **kwargs)
    pipe = gp.train(copy.deepcopy(gcnii), small_graph, "pipeline", cluster=cluster, **kwargs)
    assert _rel(pipe.history["loss"], local.history["loss"]) < 1e-5
    assert pipe.history["val_acc"].tolist() == local.history["val_acc"].tolist()
    # a stage keeps two chunks' sends pending: past them it waits for the oldest, which is
    # freed then, not at the phase's end (stage 1's first chunks, by its last forward)
    tl = pipe.timeline.df
    mine = tl[(tl["rank"] == 1) & (tl["epoch"] == 1) & (tl["chunk"] >= 0)]
    last = mine[mine["kind"] == "forward"]["start"].max()
    on = mine[(mine["kind"] == "send") & (mine["peer"] == 2)]
    assert len(on) == 6 * 2 and (on["end"] <= last).sum() >= 3 * 2


def test_pipeline_with_one_block_end_stages_equals_local(cluster, small_graph, gcnii):
    """Stages holding only the input projection or only the classifier (splits a plan may
    choose): ``h0`` crosses the first boundary, not the last one."""
    ranges = [(0, 1), (1, len(gcnii) - 1), (len(gcnii) - 1, len(gcnii))]
    profile = profile_model(gcnii, small_graph, 4, repeats=1)
    planned = gp.plan(gcnii, small_graph, 3, profile=profile, modes=["pipeline"],
                      schedules=["gnnpipe"])
    plan = dataclasses.replace(planned, layout=dataclasses.replace(
        planned.layout, stages=3, ranges=tuple(ranges), chunks=4))  # a split a plan may choose
    local = gp.train(copy.deepcopy(gcnii), small_graph, "local", plan=plan, epochs=3,
                     progress=False)
    pipe = gp.train(copy.deepcopy(gcnii), small_graph, "pipeline", plan=plan, epochs=3,
                    cluster=cluster, progress=False, timeout=60)
    assert _rel(pipe.history["loss"], local.history["loss"]) < 1e-5
    predicted = gp.comm_volume(gcnii, small_graph, "pipeline", ranges=ranges)
    assert _training_bytes(pipe) == 3 * predicted


def test_a_stage_without_parameters_trains_and_equals_local(cluster, small_graph):
    """A last stage holding only a parameter-free block (a uniform split of a 2-layer GCN and
    an appended check block): it has nothing to step (Adam refuses an empty parameter list)."""
    model = check_subnormals(gp.models.gcn(small_graph.num_features, hidden=8, out_dim=4,
                                           layers=2))
    assert not list(model.blocks[-1].parameters())
    kwargs = {"stages": 2, "chunks": 4, "epochs": 3, "progress": False}
    local = gp.train(copy.deepcopy(model), small_graph, "local", **kwargs)
    pipe = gp.train(copy.deepcopy(model), small_graph, "pipeline", cluster=cluster, **kwargs)
    assert _rel(pipe.history["loss"], local.history["loss"]) < 1e-5


@pytest.mark.parametrize("mode", ["pipeline", "graph", "hybrid"])
def test_eval_every_in_distributed_modes(cluster, small_graph, gcnii, mode):
    kwargs = {"pipeline": {"stages": 2}, "graph": {"parts": 2},
              "hybrid": {"stages": 2, "ways": 2, "chunks": 4}}[mode]
    run = gp.train(copy.deepcopy(gcnii), small_graph, mode, epochs=6, eval_every=4,
                   cluster=cluster, progress=False, **kwargs)
    assert run.history["epoch"].tolist() == list(range(6))
    assert run.history["loss"].notna().all()
    assert run.history.dropna(subset=["val_acc"])["epoch"].tolist() == [3, 5]
    eval_bytes = run.comm[run.comm["kind"] == "eval"]["bytes"].sum()
    if mode != "graph":  # two evaluations by one way, each sends the boundary's rows once
        assert eval_bytes == gp.comm_volume(gcnii, small_graph, "pipeline", stages=2)


def test_pipeline_returns_trained_weights(cluster, small_graph, gcnii):
    model = copy.deepcopy(gcnii)
    local = copy.deepcopy(gcnii)
    gp.train(model, small_graph, "pipeline", stages=3, chunks=4, epochs=3, cluster=cluster,
             progress=False)
    gp.train(local, small_graph, "local", stages=3, chunks=4, epochs=3, progress=False)
    for (name, a), b in zip(model.state_dict().items(), local.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), name


@pytest.mark.parametrize("parts", [2, 4])
def test_graph_equals_single(cluster, small_graph, parts):
    model = gp.models.gcnii(small_graph.num_features, hidden=16, out_dim=4, layers=6, dropout=0.0)
    single = gp.train(copy.deepcopy(model), small_graph, "single", epochs=EPOCHS, progress=False)
    graph = gp.train(copy.deepcopy(model), small_graph, "graph", parts=parts, epochs=EPOCHS,
                     cluster=cluster, progress=False)
    assert _rel(graph.history["loss"], single.history["loss"]) < 1e-5
    assert (graph.history["val_acc"] - single.history["val_acc"]).abs().max() < 1e-6
    predicted = gp.comm_volume(model, small_graph, "graph", parts=parts)
    assert (graph.history["comm_bytes"] == predicted).all()
    assert _training_bytes(graph) == EPOCHS * predicted


def test_graph_with_sage_equals_single(cluster, small_graph):
    model = gp.models.sage(small_graph.num_features, hidden=16, out_dim=4, layers=3, dropout=0.0)
    single = gp.train(copy.deepcopy(model), small_graph, "single", epochs=5, progress=False)
    graph = gp.train(copy.deepcopy(model), small_graph, "graph", parts=3, epochs=5,
                     cluster=cluster, progress=False)
    assert _rel(graph.history["loss"], single.history["loss"]) < 1e-5


def test_hybrid_bytes_and_one_way_equals_pipeline(cluster, small_graph, gcnii):
    hybrid = gp.train(copy.deepcopy(gcnii), small_graph, "hybrid", stages=2, ways=2, chunks=8,
                      epochs=EPOCHS, cluster=cluster, progress=False)
    predicted = gp.comm_volume(gcnii, small_graph, "hybrid", stages=2, ways=2, chunks=8)
    assert _training_bytes(hybrid) == EPOCHS * predicted
    assert set(hybrid.timeline.df["way"]) == {0, 1}
    one_way = gp.train(copy.deepcopy(gcnii), small_graph, "hybrid", stages=2, ways=1, chunks=8,
                       epochs=EPOCHS, cluster=cluster, progress=False)
    pipe = gp.train(copy.deepcopy(gcnii), small_graph, "pipeline", stages=2, chunks=8,
                    epochs=EPOCHS, cluster=cluster, progress=False)
    assert _rel(one_way.history["loss"], pipe.history["loss"]) < 1e-5


def test_measured_timeline_has_the_simulator_columns(cluster, small_graph, gcnii, tmp_path):
    run = gp.train(copy.deepcopy(gcnii), small_graph, "pipeline", stages=2, chunks=4, epochs=2,
                   cluster=cluster, progress=False)
    df = run.timeline.df
    assert list(df.columns) == list(gp.Timeline().df.columns)
    fwd = df[df["kind"] == "forward"]
    assert len(fwd) == 2 * 2 * 4 and set(fwd["rank"]) == {0, 1}
    sends = df[(df["kind"] == "send") & (df["rank"] == 0)]
    assert (sends["peer"] == 1).all() and (sends["bytes"] > 0).all()
    # stage 1 cannot start chunk c before stage 0 finished it
    for epoch in (0, 1):
        f = fwd[fwd["epoch"] == epoch].set_index(["rank", "chunk"])
        for c in range(4):
            assert f.loc[(1, c), "start"] >= f.loc[(0, c), "end"] - 1e-3
    assert run.to_chrome_trace(tmp_path / "t.json").exists()
