"""PyG models in, as they are: ``gp.models.from_pyg`` and ``ctx.message_passing`` in one process
(exact against plain PyTorch; the pushing backward equals the pull for linear layers)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from mirrored_blocks import mirrored
from torch import nn
from torch_geometric.nn import GATConv, GCNConv, MessagePassing, Sequential, SGConv
from torch_geometric.nn.models import GAT, GCN, GIN, GraphSAGE

import gnnpipe as gp
from gnnpipe.core.techniques import Techniques
from gnnpipe.engine.chunked import StageExecutor, chunk_order
from gnnpipe.engine.graph import normalized_adjacency
from gnnpipe.engine.single import FullGraphContext, chunk_loss
from gnnpipe.models import LayerStack

EPOCHS = 4


def _rel(a, b) -> float:
    a, b = torch.tensor(list(a)), torch.tensor(list(b))
    return float(((a - b).abs() / b.abs()).max())


def plain_losses(model: nn.Module, data, epochs: int, lr: float = 0.01) -> list[float]:
    """The reference: a plain PyTorch loop over the PyG module on the full graph, with gnnpipe's
    loss (mean cross-entropy over training nodes) and Adam (weight decay 5e-4 on every group)."""
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=5e-4)
    losses = []
    for _ in range(epochs):
        model.train()
        opt.zero_grad()
        out = model(data.x, data.edge_index)
        loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


class EdgeMLPConv(MessagePassing):
    """A user's nonlinear layer: max over ``MLP([x_i, x_j - x_i])`` (EdgeConv-like)."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__(aggr="max")
        self.mlp = nn.Sequential(nn.Linear(2 * in_dim, out_dim), nn.Tanh(), nn.Linear(out_dim, out_dim))

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x)

    def message(self, x_i, x_j):
        return self.mlp(torch.cat([x_i, x_j - x_i], dim=1))


def residual_sequential(in_dim: int, hidden: int, out_dim: int) -> Sequential:
    """Input projection, two residual message-passing layers (one custom), a LayerNorm, a head."""
    return Sequential("x, edge_index", [
        (nn.Linear(in_dim, hidden), "x -> x"), nn.ReLU(),
        (EdgeMLPConv(hidden, hidden), "x, edge_index -> h"),
        (lambda x, h: x + h, "x, h -> x"),
        (nn.LayerNorm(hidden), "x -> x"), (nn.Dropout(0.0), "x -> x"),
        (GATConv(hidden, hidden), "x, edge_index -> h"),
        (lambda x, h: x + h.relu(), "x, h -> x"),
        (nn.Linear(hidden, out_dim), "x -> x"),
    ])


@pytest.mark.parametrize("cls", [GCN, GraphSAGE, GIN, GAT])
def test_basic_gnn_trains_like_plain_pytorch(cls, small_graph):
    model = cls(small_graph.num_features, 16, 8, out_channels=4)
    reference = plain_losses(copy.deepcopy(model), small_graph, EPOCHS)
    run = gp.train(model, small_graph, "local", chunks=1, epochs=EPOCHS, progress=False)
    assert _rel(run.history["loss"].to_numpy(), reference) < 1e-5


def test_user_model_object_is_trained(small_graph):
    model = GAT(small_graph.num_features, 16, 3, out_channels=4)
    reference = copy.deepcopy(model)
    plain_losses(reference, small_graph, EPOCHS)
    gp.train(model, small_graph, "single", epochs=EPOCHS, progress=False)
    for (name, a), b in zip(model.named_parameters(), reference.parameters()):
        assert torch.allclose(a, b, atol=1e-6), name


def test_sequential_with_residuals_and_a_custom_layer(small_graph):
    model = residual_sequential(small_graph.num_features, 16, 4)
    stack = gp.models.from_pyg(model)
    assert [b.kind for b in stack.blocks] == ["input", "gnn", "gnn", "output"]
    assert [b.out_dim for b in stack.blocks] == [16, 16, 16, 4]
    assert stack.num_layers == 2
    reference = plain_losses(copy.deepcopy(model), small_graph, EPOCHS)
    run = gp.train(model, small_graph, "local", stages=2, chunks=1, epochs=EPOCHS, progress=False)
    assert _rel(run.history["loss"].to_numpy(), reference) < 1e-5
    chunked = gp.train(copy.deepcopy(model), small_graph, "local", stages=2, chunks=4, epochs=EPOCHS,
                       recompute=True, progress=False)
    plain = gp.train(copy.deepcopy(model), small_graph, "local", stages=4, chunks=4, epochs=EPOCHS,
                     progress=False)
    assert _rel(chunked.history["loss"].to_numpy(), plain.history["loss"].to_numpy()) < 1e-6


# --------------------------------------------------------------------------- linear = pull
def chunked_grads(model: LayerStack, graph, techniques, epochs: int, chunks: int = 4):
    """Parameter gradients of the last of ``epochs`` chunked epochs (no optimizer steps)."""
    parts = gp.chunk(graph, chunks, seed=0)
    data, bounds = parts.apply(graph), parts.bounds.tolist()
    adj = normalized_adjacency(data.edge_index, data.num_nodes, model.norm)
    ex = StageExecutor(model, 0, len(model), adj, bounds, Techniques.coerce(techniques), seed=0)
    num_train = int(data.train_mask.sum())
    for epoch in range(epochs):
        model.zero_grad(set_to_none=True)
        ex.begin_epoch(epoch)
        order = chunk_order(chunks, 0, epoch, ex.techniques.random_order)
        for c in order:
            lo, hi = bounds[c], bounds[c + 1]
            ex.forward(c, [data.x[lo:hi]], (data.y[lo:hi], data.train_mask[lo:hi], num_train))
        for c in reversed(order):
            ex.backward(c)
        ex.end_epoch()
    return [p.grad.clone() for p in model.parameters()], data, adj, ex


@pytest.mark.parametrize("family", ["gcn", "sage"])
@pytest.mark.parametrize("techniques", [True, {"unbiased_grad": False}, False])
def test_linear_message_passing_equals_aggregate(family, techniques, small_graph):
    ref, mirror = mirrored(family, small_graph)
    want, *_ = chunked_grads(copy.deepcopy(ref), small_graph, techniques, epochs=3)
    got, *_ = chunked_grads(copy.deepcopy(mirror), small_graph, techniques, epochs=3)
    for a, b in zip(got, want):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)
    a = gp.train(copy.deepcopy(ref), small_graph, "local", stages=2, chunks=4, epochs=EPOCHS,
                 techniques=techniques, progress=False)
    b = gp.train(copy.deepcopy(mirror), small_graph, "local", stages=2, chunks=4, epochs=EPOCHS,
                 techniques=techniques, recompute=True, progress=False)
    assert _rel(b.history["loss"].to_numpy(), a.history["loss"].to_numpy()) < 1e-5


def test_historical_gradients_are_exact_at_a_fixed_point(small_graph):
    """Unbiased gradients off, weights held: once every chunk has pushed with the current
    Jacobians, a nonlinear layer's chunked gradients are the full-graph ones; with the unbiased
    technique on they are not (other chunks' pushes count 2x or not yet)."""
    model = gp.models.from_pyg(GAT(small_graph.num_features, 16, 2, out_channels=4, heads=2))
    got, data, adj, ex = chunked_grads(model, small_graph, False, epochs=5)
    model.zero_grad(set_to_none=True)
    logits = model(data.x, FullGraphContext(adj, training=True))
    chunk_loss(logits, data.y, data.train_mask, int(data.train_mask.sum())).backward()
    exact = [p.grad.clone() for p in model.parameters()]
    for a, b in zip(got, exact):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)
    first, second = (ex.buffers[k] for k in sorted(ex.buffers))  # the features need no gradient:
    assert set(first.tensors()) == {"H"} and set(second.tensors()) == {"H", "dZ"}
    unbiased, *_ = chunked_grads(model, small_graph, {"snapshot": False, "unbiased_grad": True},
                                 epochs=5)
    assert not all(torch.allclose(a, b, rtol=1e-3, atol=1e-5) for a, b in zip(unbiased, exact))


# --------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("make, match", [
    (lambda: GCN(24, 16, 3, out_channels=4, norm="batch_norm"), r"model\.norms\.0: BatchNorm"),
    (lambda: GCN(24, 16, 3, out_channels=4, norm="layer_norm"), r"model\.norms\.0: LayerNorm.*'node'"),
    (lambda: GCN(24, 16, 3, out_channels=4, jk="cat"), r"model\.jk: jumping knowledge 'cat'"),
    (lambda: Sequential("x, edge_index", [
        (nn.Sequential(nn.Linear(24, 4), nn.Dropout(0.2)), "x -> x")]),
     r"model\[0\] \(module_0\)\.1: Dropout\(p=0\.2\) inside a part"),
    (lambda: GIN(24, 16, 2, out_channels=4, norm="batch_norm"), r"model\.convs\.0\.nn.*BatchNorm"),
    (lambda: Sequential("x, edge_index", [(SGConv(24, 4, K=2), "x, edge_index -> x")]),
     r"model\[0\].*SGConv propagates K hops"),
    (lambda: Sequential("x, edge_index, batch", [(GCNConv(24, 4), "x, edge_index -> x")]),
     r"takes \(x, edge_index\)"),
    (lambda: nn.Linear(24, 4), r"model: expected a torch_geometric BasicGNN"),
])
def test_what_cannot_be_chunked_is_refused_by_name(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        gp.models.from_pyg(make())


def test_row_wise_layer_norm_is_accepted(small_graph):
    model = GCN(small_graph.num_features, 16, 3, out_channels=4, norm="layer_norm",
                norm_kwargs={"mode": "node"})
    reference = plain_losses(copy.deepcopy(model), small_graph, EPOCHS)
    run = gp.train(model, small_graph, "local", chunks=1, epochs=EPOCHS, progress=False)
    assert _rel(run.history["loss"].to_numpy(), reference) < 1e-5


def test_attention_dropout_is_keyed_like_feature_dropout(small_graph):
    """GAT's own (attention) dropout draws from a generator seeded per (epoch, chunk, layer):
    one chunk equals single exactly, a replay under recompute draws the same masks, and the
    masks do change the result."""
    model = GAT(small_graph.num_features, 16, 3, out_channels=4, heads=2, dropout=0.5)
    single = gp.train(copy.deepcopy(model), small_graph, "single", epochs=EPOCHS, progress=False)
    one = gp.train(copy.deepcopy(model), small_graph, "local", chunks=1, epochs=EPOCHS,
                   progress=False)
    assert _rel(one.history["loss"], single.history["loss"]) < 1e-5
    chunked = [gp.train(copy.deepcopy(model), small_graph, "local", stages=2, chunks=4,
                        epochs=EPOCHS, recompute=recompute, progress=False)
               for recompute in (False, True)]
    assert _rel(chunked[1].history["loss"], chunked[0].history["loss"]) < 1e-5
    plain = copy.deepcopy(model)
    for conv in plain.convs:
        conv.dropout = 0.0
    no_attention = gp.train(plain, small_graph, "single", epochs=EPOCHS, progress=False)
    assert _rel(no_attention.history["loss"], single.history["loss"]) > 1e-3


def test_graph_mode_refuses_in_layer_dropout_before_any_worker(small_graph):
    model = GAT(small_graph.num_features, 16, 2, out_channels=4, dropout=0.3)
    with pytest.raises(ValueError, match=r"model\.convs\.0: drops out inside the layer"):
        gp.train(model, small_graph, "graph", parts=2, epochs=1, cluster="tcp://127.0.0.1:1",
                 progress=False)


def test_hybrid_refuses_reversed_flow_before_any_worker(small_graph):
    model = Sequential("x, edge_index", [
        (GCNConv(small_graph.num_features, 4, flow="target_to_source"), "x, edge_index -> x")])
    with pytest.raises(ValueError, match=r"model\.module_0: mode 'hybrid'.*flow"):
        gp.train(model, small_graph, "hybrid", stages=1, ways=2, epochs=1,
                 cluster="tcp://127.0.0.1:1", progress=False)


def test_pyg_models_default_to_fresh_rows_and_latest_gradients(small_graph):
    """No techniques given: the snapshot and unbiased gradients are off for a stack with PyG
    layers (what trains attention best, benchmarks/pyg_accuracy.py); built-in stacks keep the
    snapshot, unbiased gradients off too (issue #28); given ones are used as given."""
    gat = GAT(small_graph.num_features, 16, 2, out_channels=4)
    builtin = gp.models.gcn(small_graph.num_features, hidden=16, out_dim=4, layers=2)

    def techniques(model, **kw):
        run = gp.train(model, small_graph, "local", chunks=2, epochs=1, progress=False, **kw)
        return dataclasses.asdict(run.config.techniques)

    assert techniques(copy.deepcopy(gat)) == {"random_order": True, "snapshot": False,
                                              "snapshot_period": 23, "unbiased_grad": False}
    assert all(techniques(copy.deepcopy(gat), techniques=True).values())
    assert techniques(builtin) == {"random_order": True, "snapshot": True,  # issue #28
                                   "snapshot_period": 23, "unbiased_grad": False}
    fresh = gp.train(copy.deepcopy(gat), small_graph, "local", chunks=4, epochs=EPOCHS,
                     progress=False)
    explicit = gp.train(copy.deepcopy(gat), small_graph, "local", chunks=4, epochs=EPOCHS,
                        techniques={"snapshot": False, "unbiased_grad": False}, progress=False)
    assert _rel(fresh.history["loss"], explicit.history["loss"]) < 1e-6
