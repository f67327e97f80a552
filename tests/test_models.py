"""Models: LayerStack structure, depth range, and agreement with PyTorch Geometric's layers."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.nn import GCN2Conv, GCNConv
from torch_geometric.nn.conv.gcn_conv import gcn_norm

import gnnpipe as gp
from gnnpipe.engine.graph import normalized_adjacency
from gnnpipe.engine.single import FullGraphContext


@pytest.mark.parametrize("name", sorted(gp.models.MODELS))
@pytest.mark.parametrize("layers", [1, 2, 7, 128])
def test_every_family_builds_any_depth(name, layers, small_graph):
    model = gp.models.build(name, small_graph.num_features, 4, layers=layers, hidden=8)
    assert model.num_layers == layers
    adj = normalized_adjacency(small_graph.edge_index, small_graph.num_nodes, model.norm)
    out = model(small_graph.x, FullGraphContext(adj))
    assert out.shape == (small_graph.num_nodes, 4)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("layers", [0, 129, 2.5])
def test_depth_outside_1_to_128_is_rejected(layers):
    with pytest.raises(ValueError, match="layers: expected an integer from 1 to 128"):
        gp.models.gcn(8, layers=layers)


def test_unknown_model_names_the_choices():
    with pytest.raises(ValueError, match="model: unknown model 'gat'"):
        gp.models.build("gat", 8, 2, layers=2)


def test_bad_width_and_dropout_are_rejected():
    with pytest.raises(ValueError, match="hidden"):
        gp.models.gcnii(8, hidden=0)
    with pytest.raises(ValueError, match="dropout"):
        gp.models.sage(8, dropout=1.0)


def test_gcnii_stack_layout_and_boundaries():
    model = gp.models.gcnii(100, hidden=16, out_dim=3, layers=4)
    assert [b.kind for b in model.blocks] == ["input"] + ["gnn"] * 4 + ["output"]
    assert model.boundary_widths(1) == [16, 16]  # h and h0 cross into the GCNII layers
    assert model.boundary_widths(5) == [16]  # the classifier needs no h0
    groups = model.param_groups(5e-4, 0.01)
    assert [g["weight_decay"] for g in groups] == [0.01, 5e-4]
    assert sum(p.numel() for g in groups for p in g["params"]) == sum(
        p.numel() for p in model.parameters())


def test_gcn_matches_pyg_gcnconv(small_graph):
    model = gp.models.gcn(small_graph.num_features, hidden=8, out_dim=4, layers=2, dropout=0.0)
    convs = [GCNConv(24, 8), GCNConv(8, 4)]
    for conv, block in zip(convs, model.blocks):
        conv.lin.weight.data.copy_(block.lin.weight)
        conv.bias.data.copy_(block.bias)
    ei = small_graph.edge_index
    ref = convs[1](convs[0](small_graph.x, ei).relu(), ei)
    adj = normalized_adjacency(ei, small_graph.num_nodes, "sym")
    assert torch.allclose(model(small_graph.x, FullGraphContext(adj)), ref, atol=1e-5)


def test_gcnii_layer_matches_pyg_gcn2conv(small_graph):
    model = gp.models.gcnii(small_graph.num_features, hidden=8, out_dim=4, layers=3, dropout=0.0)
    ei, w = gcn_norm(small_graph.edge_index, num_nodes=small_graph.num_nodes)
    adj = normalized_adjacency(small_graph.edge_index, small_graph.num_nodes, "sym")
    ctx = FullGraphContext(adj)
    h = h0 = model.blocks[0].lin(small_graph.x).relu()
    for i, block in enumerate(model.blocks[1:4]):
        conv = GCN2Conv(8, alpha=0.1, theta=0.5, layer=i + 1, shared_weights=True, normalize=False)
        conv.weight1.data.copy_(block.weight)
        ref = conv(h, h0, ei, w).relu()
        ours, _ = block(h, h0, ctx)
        assert torch.allclose(ours, ref, atol=1e-5)
        h = ref


def test_the_gcnii_update_keeps_a_sign_not_its_output_and_differentiates_alike():
    """GCNII's fused update keeps z and a one-byte sign for its backward; its gradients equal
    those of relu(addmm(...)) (gradcheck in float64) and it keeps a quarter less."""
    from gnnpipe.nn.layers import _GCNIIUpdate

    z = torch.randn(30, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: _GCNIIUpdate.apply(a, b, 0.3), (z, w))
    kept = {}
    for name, fn in (("fused", lambda a, b: _GCNIIUpdate.apply(a, b, 0.3)),
                     ("plain", lambda a, b: torch.relu(torch.addmm(a, a, b, beta=0.7, alpha=0.3)))):
        total = [0]

        def pack(t, total=total):
            total[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn(z.float().detach().requires_grad_(), w.float().detach().requires_grad_())
        kept[name] = total[0]
    rows = 30 * 8 * 4
    assert kept["plain"] - kept["fused"] == rows - 30 * 8  # a float output -> a bool sign


def test_gcnii_inference_holds_one_graph_wide_tensor_besides_its_inputs():
    """Outside training a GCNII layer writes its output over ``Â h`` in row blocks: the same
    values as its training forward, one graph-wide tensor (plus sixteenths) where the training
    forward holds three at once (an evaluation's peak on a pipeline rank)."""
    from gnnpipe.analysis.footprint import LiveBytes
    from gnnpipe.engine.graph import PRODUCT_BLOCK_BYTES

    data = gp.datasets.synthetic(num_nodes=20_000, avg_degree=10, num_features=64, seed=0)
    block = gp.models.gcnii(64, hidden=64, out_dim=4, layers=2, dropout=0.5).blocks[2]
    adj = normalized_adjacency(data.edge_index, data.num_nodes, "sym")
    h, h0 = torch.randn(data.num_nodes, 64), torch.randn(data.num_nodes, 64)
    graph_wide = h.numel() * h.element_size()
    peaks = {}
    for name, training in (("inference", False), ("training", True)):
        block.p = 0.0 if training else 0.5  # the same values: no dropout either way
        with LiveBytes() as live, torch.no_grad():
            out, kept = block(h, h0, FullGraphContext(adj, training=training))
        peaks[name], peaks[f"{name} out"] = live.peak, out
        assert kept is h0
    assert torch.allclose(peaks["inference out"], peaks["training out"], atol=1e-6)
    # one graph-wide tensor, a block of its aggregation's rows and sixteenths
    assert peaks["inference"] <= 1.25 * graph_wide + PRODUCT_BLOCK_BYTES
    assert peaks["training"] >= 2.5 * graph_wide


def test_stages_split_the_gnn_layers_evenly_with_projections_at_the_ends():
    from gnnpipe.engine.local import stage_ranges

    model = gp.models.gcnii(64, hidden=64, out_dim=8, layers=32)  # input, 32 layers, classifier
    assert stage_ranges(model, 4) == [(0, 9), (9, 17), (17, 25), (25, 34)]  # 8 layers each
    assert stage_ranges(34, 4) == [(0, 8), (8, 17), (17, 26), (26, 34)]  # blocks alike
    assert stage_ranges(model, 2) == [(0, 17), (17, 34)]
    six = gp.models.gcnii(64, hidden=8, out_dim=4, layers=6)  # the 2 left over go mid-pipeline
    assert stage_ranges(six, 4) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    shallow = gp.models.gcnii(64, hidden=8, out_dim=4, layers=2)  # fewer layers than stages
    assert stage_ranges(shallow, 4) == stage_ranges(len(shallow), 4)
    with pytest.raises(ValueError, match="stages: expected 1 to 34"):
        stage_ranges(model, 35)
