"""PyG models on real Dask workers: ``pipeline`` equals ``local``, ``graph`` equals ``single``, the
hybrid's linear case equals the built-in one, and the bytes sent equal ``gp.comm_volume`` (graph
parallelism and the hybrid exchange each layer's input width)."""

from __future__ import annotations

import copy
import sys

import cloudpickle
import pytest
import torch
from mirrored_blocks import mirrored
from torch import nn
from torch_geometric.nn import GATConv, MessagePassing, Sequential
from torch_geometric.nn.models import GAT, GCN, GIN, GraphSAGE

import gnnpipe as gp

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/

EPOCHS = 3


class GatedConv(MessagePassing):
    """A user's nonlinear layer: ``sum_j sigmoid(a·[x_i, x_j]) W x_j + R x_i``."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__(aggr="add")
        self.gate = nn.Linear(2 * in_dim, 1)
        self.lin, self.root = nn.Linear(in_dim, out_dim), nn.Linear(in_dim, out_dim)

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x) + self.root(x)

    def message(self, x_i, x_j):
        return torch.sigmoid(self.gate(torch.cat([x_i, x_j], dim=1))) * self.lin(x_j)


def custom_sequential(in_dim: int) -> Sequential:
    return Sequential("x, edge_index", [
        (GatedConv(in_dim, 16), "x, edge_index -> x"), nn.ReLU(),
        (GatedConv(16, 16), "x, edge_index -> h"), (lambda x, h: x + h, "x, h -> x"),
        (GATConv(16, 4), "x, edge_index -> x"),
    ])


def _rel(a, b) -> float:
    a, b = torch.tensor(a.to_numpy()), torch.tensor(b.to_numpy())
    return float(((a - b).abs() / b.abs()).max())


def _training_bytes(run) -> int:
    kinds = ["activation", "gradient", "halo", "halo_grad", "boundary", "boundary_grad"]
    return int(run.comm[run.comm["kind"].isin(kinds)]["bytes"].sum())


MODELS = {
    "GCN": lambda d: GCN(d, 16, 8, out_channels=4),
    "GraphSAGE": lambda d: GraphSAGE(d, 16, 8, out_channels=4),
    "GIN": lambda d: GIN(d, 16, 8, out_channels=4),
    "GAT": lambda d: GAT(d, 16, 8, out_channels=4, heads=2),
    "custom": custom_sequential,
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_pyg_pipeline_equals_local(cluster, small_graph, name):
    model = MODELS[name](small_graph.num_features)
    local_model = copy.deepcopy(model)
    local = gp.train(local_model, small_graph, "local", stages=2, chunks=4, epochs=EPOCHS,
                     progress=False)
    pipe = gp.train(model, small_graph, "pipeline", stages=2, chunks=4, epochs=EPOCHS,
                    cluster=cluster, progress=False)
    assert _rel(pipe.history["loss"], local.history["loss"]) < 1e-5
    predicted = gp.comm_volume(model, small_graph, "pipeline", stages=2)
    assert _training_bytes(pipe) == EPOCHS * predicted
    for a, b in zip(model.parameters(), local_model.parameters()):  # the user's object, trained
        assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_pyg_graph_equals_single(cluster, small_graph, name):
    model = MODELS[name](small_graph.num_features)
    single = gp.train(copy.deepcopy(model), small_graph, "single", epochs=EPOCHS, progress=False)
    graph = gp.train(copy.deepcopy(model), small_graph, "graph", parts=2, epochs=EPOCHS,
                     cluster=cluster, progress=False)
    assert _rel(graph.history["loss"], single.history["loss"]) < 1e-5
    assert (graph.history["val_acc"] - single.history["val_acc"]).abs().max() < 1e-6
    predicted = gp.comm_volume(model, small_graph, "graph", parts=2)
    assert _training_bytes(graph) == EPOCHS * predicted


@pytest.mark.parametrize("techniques, recompute", [(True, False), ({"unbiased_grad": False}, False),
                                                   (True, True)])
def test_pyg_hybrid_linear_layer_equals_builtin(cluster, small_graph, techniques, recompute):
    """Two ways x two stages: a GCN whose aggregation is PyG's LGConv trains exactly like the
    built-in GCN (pushes shared between ways = the pull's shared dZ rows), bytes as predicted."""
    ref, mirror = mirrored("gcn", small_graph)
    kwargs = {"stages": 2, "ways": 2, "chunks": 8, "epochs": EPOCHS, "techniques": techniques,
              "recompute": recompute, "cluster": cluster, "progress": False}
    want = gp.train(copy.deepcopy(ref), small_graph, "hybrid", **kwargs)
    got = gp.train(copy.deepcopy(mirror), small_graph, "hybrid", **kwargs)
    assert _rel(got.history["loss"], want.history["loss"]) < 1e-5
    predicted = gp.comm_volume(mirror, small_graph, "hybrid", stages=2, ways=2, chunks=8)
    assert _training_bytes(got) == EPOCHS * predicted
    assert predicted != gp.comm_volume(ref, small_graph, "hybrid", stages=2, ways=2, chunks=8)


@pytest.mark.parametrize("name", ["GAT", "custom"])
def test_pyg_hybrid_bytes_and_one_way_equals_pipeline(cluster, small_graph, name):
    model = MODELS[name](small_graph.num_features)
    hybrid = gp.train(copy.deepcopy(model), small_graph, "hybrid", stages=2, ways=2, chunks=8,
                      epochs=EPOCHS, cluster=cluster, progress=False)
    predicted = gp.comm_volume(model, small_graph, "hybrid", stages=2, ways=2, chunks=8)
    assert _training_bytes(hybrid) == EPOCHS * predicted
    assert hybrid.history["loss"].iloc[-1] < hybrid.history["loss"].iloc[0]
    one_way = gp.train(copy.deepcopy(model), small_graph, "hybrid", stages=2, ways=1, chunks=8,
                       epochs=EPOCHS, cluster=cluster, progress=False)
    pipe = gp.train(copy.deepcopy(model), small_graph, "pipeline", stages=2, chunks=8,
                    epochs=EPOCHS, cluster=cluster, progress=False)
    assert _rel(one_way.history["loss"], pipe.history["loss"]) < 1e-5


def test_pyg_attention_dropout_pipeline_equals_local(cluster, small_graph):
    """GAT's attention dropout is seeded per (epoch, chunk, layer), so ranks draw local's masks."""
    model = GAT(small_graph.num_features, 16, 4, out_channels=4, heads=2, dropout=0.5)
    local = gp.train(copy.deepcopy(model), small_graph, "local", stages=2, chunks=4,
                     epochs=EPOCHS, progress=False)
    pipe = gp.train(copy.deepcopy(model), small_graph, "pipeline", stages=2, chunks=4,
                    epochs=EPOCHS, cluster=cluster, progress=False)
    assert _rel(pipe.history["loss"], local.history["loss"]) < 1e-5
