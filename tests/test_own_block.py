"""A user's own block in every mode: an APPNP-style stack whose steps read ``h0``
(``carries_h0=True``), and the errors ``LayerStack`` gives for parts that are not blocks."""

from __future__ import annotations

import copy
import sys

import cloudpickle
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gnnpipe as gp
from gnnpipe.models import Block, Dense, GCNLayer, LayerStack

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/

EPOCHS = 3
HIDDEN = 16


class Project(Block):
    """Input projection ``relu(W dropout(x))``; its output is also ``h0``."""

    kind = "input"
    sets_h0 = True

    def __init__(self, in_dim: int, out_dim: int, p: float) -> None:
        super().__init__()
        self.in_dim, self.out_dim, self.p = in_dim, out_dim, p
        self.lin = nn.Linear(in_dim, out_dim)

    def forward(self, h, h0, ctx):
        h = F.relu(self.lin(ctx.dropout(h, self.p, self.key)))
        return h, h


class APPNPStep(Block):
    """One APPNP propagation step: ``(1-α) Â dropout(h) + α h0``."""

    aggregates = True
    carries_h0 = True

    def __init__(self, dim: int, alpha: float, p: float) -> None:
        super().__init__()
        self.in_dim = self.out_dim = dim
        self.alpha, self.p = alpha, p

    def forward(self, h, h0, ctx):
        if h0 is None:
            raise RuntimeError("APPNPStep got h0=None")
        h = ctx.aggregate(ctx.dropout(h, self.p, self.key), self.key)
        return (1 - self.alpha) * h + self.alpha * h0, h0


class Classify(Block):
    """Linear classifier; returns no ``h0`` (``run`` passes it on)."""

    kind = "output"

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.in_dim, self.out_dim = in_dim, out_dim
        self.lin = nn.Linear(in_dim, out_dim)

    def forward(self, h, h0, ctx):
        return self.lin(h), None


def appnp(in_dim: int, steps: int = 4, p: float = 0.0) -> LayerStack:
    torch.manual_seed(0)
    blocks = [Project(in_dim, HIDDEN, p), *(APPNPStep(HIDDEN, 0.1, p) for _ in range(steps)),
              Classify(HIDDEN, 4)]
    return LayerStack(blocks, norm="sym", name="appnp")


def _train(model: LayerStack, data, mode: str, **kwargs):
    return gp.train(copy.deepcopy(model), data, mode, epochs=EPOCHS, progress=False, **kwargs)


def _close(a, b, tol: float = 1e-5) -> bool:
    a, b = torch.tensor(a.to_numpy()), torch.tensor(b.to_numpy())
    return float(((a - b).abs() / b.abs()).max()) < tol


def test_h0_crosses_the_boundaries_before_the_last_block_reading_it(small_graph):
    model = appnp(small_graph.num_features)
    assert [model.boundary_widths(i) for i in range(1, len(model))] == [[HIDDEN, HIDDEN]] * 4 + [[HIDDEN]]
    n = small_graph.num_nodes
    assert gp.comm_volume(model, small_graph, "pipeline", stages=2) == 2 * n * 2 * HIDDEN * 4


def test_a_block_setting_h0_again_stops_the_old_one_crossing():
    blocks = [Project(8, HIDDEN, 0.0), APPNPStep(HIDDEN, 0.1, 0.0), Project(HIDDEN, HIDDEN, 0.0),
              APPNPStep(HIDDEN, 0.1, 0.0)]
    model = LayerStack(blocks)
    assert model.boundary_widths(2) == [HIDDEN]
    assert model.boundary_widths(3) == [HIDDEN, HIDDEN]


def test_local_with_one_chunk_equals_single(small_graph):
    model = appnp(small_graph.num_features)
    single = _train(model, small_graph, "single")
    local = _train(model, small_graph, "local", stages=2, chunks=1)
    assert _close(local.history["loss"], single.history["loss"])
    assert single.history["loss"].iloc[-1] < single.history["loss"].iloc[0]


def test_pipeline_equals_local(cluster, small_graph):
    model = appnp(small_graph.num_features, p=0.3)
    local = _train(model, small_graph, "local", stages=2, chunks=4)
    pipe = _train(model, small_graph, "pipeline", stages=2, chunks=4, cluster=cluster)
    assert _close(pipe.history["loss"], local.history["loss"])
    assert (pipe.history["comm_bytes"] == gp.comm_volume(model, small_graph, "pipeline", stages=2)).all()


def test_graph_equals_single(cluster, small_graph):
    model = appnp(small_graph.num_features)
    single = _train(model, small_graph, "single")
    graph = _train(model, small_graph, "graph", parts=2, cluster=cluster)
    assert _close(graph.history["loss"], single.history["loss"])


def test_hybrid_trains_with_h0_crossing(cluster, small_graph):
    model = appnp(small_graph.num_features)
    run = _train(model, small_graph, "hybrid", stages=2, ways=2, chunks=4, cluster=cluster)
    assert len(run.history) == EPOCHS and run.history["loss"].notna().all()
    predicted = gp.comm_volume(model, small_graph, "hybrid", stages=2, ways=2, chunks=4)
    assert (run.history["comm_bytes"] == predicted).all()


class NoH0(Project):
    def forward(self, h, h0, ctx):
        return super().forward(h, h0, ctx)[0], None


def test_a_setter_returning_no_h0_is_named(small_graph):
    blocks = [NoH0(small_graph.num_features, HIDDEN, 0.0), APPNPStep(HIDDEN, 0.1, 0.0),
              Classify(HIDDEN, 4)]
    with pytest.raises(RuntimeError, match=r"blocks\[1\] \(APPNPStep\) reads h0 .* got None"):
        gp.train(LayerStack(blocks), small_graph, "single", epochs=1, progress=False)


# ------------------------------------------------------------------ LayerStack of wrong parts
def _pyg_conv() -> nn.Module:
    from torch_geometric.nn import GCNConv

    return GCNConv(8, 8)


@pytest.mark.parametrize(("parts", "error", "message"), [
    (list, ValueError, r"blocks: expected at least one gnnpipe.models.Block, got an empty list"),
    (lambda: GCNLayer(8, 8, 0.0, act=False), TypeError,
     r"blocks: expected a list of gnnpipe.models.Block, got .*GCNLayer; a single block goes in a list"),
    (lambda: [GCNLayer(8, 8, 0.0, act=True), nn.Linear(8, 4)], TypeError,
     (r"blocks\[1\]: expected a gnnpipe.models.Block .*, got torch.nn.modules.linear.Linear; "
      r"wrap a torch module in a Block")),
    (lambda: [_pyg_conv()], TypeError,
     r"blocks\[0\]: expected a gnnpipe.models.Block .*, got torch_geometric.*GCNConv; a PyG layer"),
    (lambda: [GCNLayer(8, 8, 0.0, act=True), "gcn"], TypeError,
     r"blocks\[1\]: expected a gnnpipe.models.Block .*, got str$"),
    (lambda: [GCNLayer(8, 16, 0.0, act=True), GCNLayer(8, 4, 0.0, act=False)], ValueError,
     r"blocks\[1\] \(GCNLayer\).in_dim: expected 16, the out_dim of blocks\[0\] \(GCNLayer\), got 8"),
    (lambda: [Block()], ValueError, r"blocks\[0\] \(Block\).in_dim: expected a positive integer"),
    (lambda: [Dense(8, HIDDEN, 0.0, act=True, kind="input"), APPNPStep(HIDDEN, 0.1, 0.0)],
     ValueError, (r"blocks\[1\] \(APPNPStep\) reads h0 \(carries_h0=True\): expected a block "
                  r"before it that sets h0")),
    (lambda: [GCNLayer(8, 8, 0.0, act=True)] * 2, ValueError,
     r"blocks\[1\] \(GCNLayer\): expected a new module, got the one at blocks\[0\] again"),
], ids=["empty", "one-block", "torch-linear", "pyg-conv", "not-a-module", "widths", "no-dims",
        "h0-never-set", "same-module-twice"])
def test_layer_stack_of_wrong_parts_names_the_position(parts, error, message):
    with pytest.raises(error, match=message):
        LayerStack(parts())


def test_gcnii_reads_h0_from_its_projection():
    model = gp.models.gcnii(8, hidden=HIDDEN, out_dim=4, layers=2)
    assert [type(b).__name__ for b in model.blocks if b.carries_h0] == ["GCNIILayer"] * 2
    assert [type(b).__name__ for b in model.blocks if b.sets_h0] == ["Dense"]
