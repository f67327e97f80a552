"""The chunked GNNPipe engine: exactness with one chunk, historical rows, the three techniques."""

from __future__ import annotations

import copy

import pytest
import torch

import gnnpipe as gp
from gnnpipe.core.techniques import Techniques
from gnnpipe.engine.chunked import StageExecutor, chunk_order
from gnnpipe.engine.graph import normalized_adjacency

FAMILIES = sorted(gp.models.MODELS)


def _losses(run):
    return torch.tensor(run.history["loss"].to_numpy())


def _rel(a, b):
    return float(((a - b).abs() / b.abs()).max())


@pytest.mark.parametrize("name", FAMILIES)
def test_one_chunk_local_equals_single(name, small_graph):
    model = gp.models.build(name, small_graph.num_features, 4, layers=6, hidden=16, dropout=0.0)
    single = gp.train(copy.deepcopy(model), small_graph, "single", epochs=20, progress=False)
    local = gp.train(copy.deepcopy(model), small_graph, "local", stages=3, chunks=1, epochs=20,
                     progress=False)
    assert _rel(_losses(local), _losses(single)) < 1e-5
    assert single.history["val_acc"].tolist() == local.history["val_acc"].tolist()


def test_one_chunk_is_exact_with_dropout_too(small_graph):
    model = gp.models.gcnii(small_graph.num_features, hidden=16, out_dim=4, layers=8, dropout=0.5)
    single = gp.train(copy.deepcopy(model), small_graph, "single", epochs=10, progress=False)
    local = gp.train(copy.deepcopy(model), small_graph, "local", stages=2, chunks=1, epochs=10,
                     progress=False)
    assert _rel(_losses(local), _losses(single)) < 1e-5


def test_many_chunks_differ_from_single_but_still_learn(small_graph):
    model = gp.models.gcnii(small_graph.num_features, hidden=16, out_dim=4, layers=8, dropout=0.2)
    single = gp.train(copy.deepcopy(model), small_graph, "single", epochs=40, progress=False)
    local = gp.train(copy.deepcopy(model), small_graph, "local", stages=2, chunks=8, epochs=40,
                     progress=False)
    assert _rel(_losses(local)[1:], _losses(single)[1:]) > 1e-4  # historical rows change the math
    assert local.best["test_acc"] > 0.6
    assert abs(local.best["test_acc"] - single.best["test_acc"]) < 0.1


@pytest.mark.parametrize("name", ["gcnii", "resgcn_plus"])
def test_stage_split_and_recompute_do_not_change_the_math(name, small_graph):
    model = gp.models.build(name, small_graph.num_features, 4, layers=6, hidden=16, dropout=0.3)
    base = gp.train(copy.deepcopy(model), small_graph, "local", stages=1, chunks=4, epochs=8,
                    progress=False)
    split = gp.train(copy.deepcopy(model), small_graph, "local", stages=4, chunks=4, epochs=8,
                     progress=False)
    recompute = gp.train(copy.deepcopy(model), small_graph, "local", stages=2, chunks=4, epochs=8,
                         recompute=True, progress=False)
    assert _rel(_losses(split), _losses(base)) < 1e-5
    assert _rel(_losses(recompute), _losses(base)) < 1e-5


def test_local_records_a_timeline(small_graph):
    model = gp.models.gcn(small_graph.num_features, hidden=8, out_dim=4, layers=4)
    run = gp.train(model, small_graph, "local", stages=2, chunks=3, epochs=2, progress=False)
    df = run.timeline.df
    assert len(df) == 2 * 2 * 3 * 2  # epochs x stages x chunks x {forward, backward}
    assert set(df["kind"]) == {"forward", "backward"} and set(df["rank"]) == {0, 1}
    assert (df["end"] >= df["start"]).all() and df["start"].min() >= 0


def test_chunk_order_is_a_seeded_permutation():
    a = chunk_order(16, seed=3, epoch=5, random_order=True)
    assert sorted(a) == list(range(16))
    assert a == chunk_order(16, seed=3, epoch=5, random_order=True)
    assert a != chunk_order(16, seed=3, epoch=6, random_order=True)
    assert chunk_order(16, seed=3, epoch=5, random_order=False) == list(range(16))


def _path_executor(techniques: Techniques, input_grad: bool = False,
                   recompute: bool = False) -> tuple[StageExecutor, torch.Tensor]:
    """A 4-node path 0-1-2-3 in two chunks {0,1}, {2,3}, one GCN layer with identity weight."""
    ei = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])
    adj = normalized_adjacency(ei, 4, "sym")
    model = gp.models.gcn(2, out_dim=2, layers=1, dropout=0.0)
    with torch.no_grad():
        model.blocks[0].lin.weight.copy_(torch.eye(2))
        model.blocks[0].bias.zero_()
    ex = StageExecutor(model, 0, 1, adj, [0, 2, 4], techniques, seed=0, recompute=recompute,
                       input_grad=input_grad)
    return ex, adj.A.to_dense()


def test_forward_reads_historical_rows_and_backward_pulls():
    ex, A = _path_executor(Techniques(random_order=False, snapshot=False, unbiased_grad=True))
    x = torch.arange(8.0).view(4, 2) + 1
    ex.begin_epoch(0)
    (z0,) = ex.forward(0, [x[:2]])
    hist = torch.zeros(4, 2)
    hist[:2] = x[:2]
    assert torch.allclose(z0, A[:2] @ hist)  # rows of chunk 1 are still zero (historical)
    (z1,) = ex.forward(1, [x[2:]])
    assert torch.allclose(z1, A[2:] @ x)  # chunk 0 rows are fresh now
    # backward in reverse order; the stage-0 inputs need no grad, so inspect the buffer instead
    g1, g0 = torch.ones(2, 2), 3 * torch.ones(2, 2)
    ex.backward(1, [g1])
    buf = ex.buffers[0]
    assert torch.allclose(buf.dZ[2:], 2 * g1) and torch.allclose(buf.dZ[:2], torch.zeros(2, 2))
    ex.backward(0, [g0])
    assert torch.allclose(buf.dZ[:2], 2 * g0)


def test_after_op_runs_once_per_chunk_forward_and_backward():
    """The hook a rank under a memory limit trims its heap in, after every chunk op: after a
    backward, once the chunk's stashed tensors are gone (what the trim is to hand back)."""
    import weakref

    ex, _ = _path_executor(Techniques(random_order=False, snapshot=False), input_grad=True,
                           recompute=True)
    ran: list[int] = []
    stashed: list[weakref.ref] = []
    ex.after_op = lambda: ran.append(len(ex.saved))
    x = torch.randn(4, 2)
    ex.begin_epoch(0)
    ex.forward(0, [x[:2]])
    stashed.append(weakref.ref(ex.saved[0].inputs[0]))
    ex.forward(1, [x[2:]])
    ex.backward(1, [torch.ones(2, 2)])
    ex.after_op = lambda: ran.append(len(ex.saved) + 10 * (stashed[0]() is not None))
    ex.backward(0, [torch.ones(2, 2)])
    assert ran == [1, 2, 1, 0]  # after each op, its chunk stashed, then freed (not still held)


def test_pull_backward_gradient_of_a_middle_stage():
    ex, A = _path_executor(Techniques(random_order=False, snapshot=False, unbiased_grad=False),
                           input_grad=True)
    x = torch.randn(4, 2)
    ex.begin_epoch(0)
    ex.forward(0, [x[:2]])
    ex.forward(1, [x[2:]])
    g = torch.randn(4, 2)
    (d1,) = ex.backward(1, [g[2:]])
    (d0,) = ex.backward(0, [g[:2]])
    dz_hist = torch.cat([torch.zeros(2, 2), g[2:]])  # chunk 0's gradient rows not yet written
    assert torch.allclose(d1, A.T[2:] @ dz_hist, atol=1e-6)
    assert torch.allclose(d0, A.T[:2] @ g, atol=1e-6)  # all rows fresh by now


def test_recompute_keeps_the_aggregations_in_one_buffer_across_epochs():
    """Recomputation's replay reads the forward's ``Z`` rows from one full-size tensor per layer
    that lives across epochs (no per-chunk tensors allocated every epoch), and its gradients
    equal those of the forward that kept its autograd graph."""
    tech = Techniques(random_order=False, snapshot=True, snapshot_period=2, unbiased_grad=True)
    grads, storages = {}, []
    for recompute in (False, True):
        ex, A = _path_executor(tech, input_grad=True, recompute=recompute)
        for epoch in range(3):
            ex.begin_epoch(epoch)
            x = torch.arange(8.0).view(4, 2) + epoch
            for c in (0, 1):
                ex.forward(c, [x[2 * c:2 * c + 2]])
            if recompute:
                z = ex.buffers[0].kept_z
                assert torch.allclose(z[2:], A[2:] @ x, atol=1e-6)  # chunk 1 read fresh rows
                storages.append(z.untyped_storage().data_ptr())
                assert all(not s.cache for s in ex.saved.values())
            grads[recompute, epoch] = [ex.backward(c, [torch.ones(2, 2)])[0] for c in (1, 0)]
            ex.end_epoch()
    assert len(set(storages)) == 1
    for epoch in range(3):
        for a, b in zip(grads[False, epoch], grads[True, epoch]):
            assert torch.allclose(a, b, atol=1e-6)


def test_snapshot_resets_history_each_epoch():
    tech = Techniques(random_order=False, snapshot=True, snapshot_period=2, unbiased_grad=True)
    ex, _ = _path_executor(tech)
    x = torch.ones(4, 2)
    for epoch in range(3):
        ex.begin_epoch(epoch)
        buf = ex.buffers.get(0)
        if buf is not None:
            assert torch.equal(buf.H, buf.snap)
        for c in (0, 1):
            ex.forward(c, [(epoch + 1) * x[2 * c:2 * c + 2]])
        ex.between_phases()  # the backward phase: dZbuf is Hbuf's memory, zeroed
        buf = ex.buffers[0]
        assert buf.dZ is buf.H and not buf.dZ.any() and set(buf.tensors()) == {"H", "snap"}
        ex.end_epoch()
        expected = 1.0 if epoch < 2 else 3.0  # snapshots at the end of epochs 0 and 2
        assert torch.allclose(ex.buffers[0].snap, torch.full((4, 2), expected))


@pytest.mark.parametrize("bad, match", [
    ({"techniques": {"nope": True}}, "techniques: unknown switches"),
    ({"techniques": {"snapshot_period": 0}}, "snapshot_period"),
    ({"techniques": 3}, "techniques: expected"),
])
def test_bad_techniques_are_rejected(bad, match, small_graph):
    model = gp.models.gcn(small_graph.num_features, out_dim=4)
    with pytest.raises((ValueError, TypeError), match=match):
        gp.train(model, small_graph, "local", epochs=1, progress=False, **bad)
