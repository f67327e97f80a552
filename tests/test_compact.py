"""Compact storage and wire: historical buffers (``history_dtype``) and boundary tensors
(``wire_dtype``) in 16 bits, computed in float32, the same arithmetic in every chunked mode,
checkpointed and resumed alike, bytes as predicted."""

from __future__ import annotations

import copy

import pandas as pd
import pytest
import torch
from torch_geometric.nn.models import GAT

import gnnpipe as gp
from gnnpipe import checkpoint as ckpt
from gnnpipe.core.job import TrainConfig
from gnnpipe.core.kinds import Precision
from gnnpipe.engine.chunked import StageExecutor

EPOCHS = 8
METRICS = ["epoch", "loss", "train_acc", "val_acc", "test_acc", "val_loss"]


def _gcnii(graph):
    torch.manual_seed(0)
    return gp.models.gcnii(graph.num_features, hidden=16, out_dim=4, layers=6, dropout=0.3)


def _buffers(model, graph, dtype, **kwargs) -> list:
    """The historical buffers one local epoch allocates with ``history_dtype=dtype``."""
    seen: list = []
    original = StageExecutor.end_epoch

    def spy(self):
        seen.extend(t for buf in self.buffers.values() for t in buf.tensors().values())
        return original(self)

    StageExecutor.end_epoch = spy
    try:
        gp.train(model, graph, "local", stages=2, chunks=4, epochs=1, progress=False,
                 history_dtype=dtype, **kwargs)
    finally:
        StageExecutor.end_epoch = original
    return seen


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, "bfloat16"])
def test_buffers_are_stored_compactly_at_half_the_bytes(small_graph, dtype):
    model = _gcnii(small_graph)
    compact = _buffers(copy.deepcopy(model), small_graph, dtype)
    full = _buffers(copy.deepcopy(model), small_graph, torch.float32)
    expected = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    assert compact and all(t.dtype == expected for t in compact)
    assert all(t.dtype == torch.float32 for t in full)
    assert (sum(t.numel() * t.element_size() for t in compact) * 2
            == sum(t.numel() * t.element_size() for t in full))


def test_compact_histories_round_but_train_like_float32(small_graph):
    model = _gcnii(small_graph)
    runs = {d: gp.train(copy.deepcopy(model), small_graph, "local", stages=2, chunks=4,
                        epochs=EPOCHS, progress=False, history_dtype=d)
            for d in (torch.float32, torch.bfloat16)}
    fp32, bf16 = (runs[d].history["loss"] for d in (torch.float32, torch.bfloat16))
    assert not fp32.equals(bf16)  # the rows are really rounded
    assert (fp32 - bf16).abs().max() < 0.02 * fp32.abs().max()
    assert runs[torch.bfloat16].config.history_dtype is Precision.BFLOAT16


def test_a_pyg_gat_trains_with_compact_histories(small_graph):
    torch.manual_seed(0)
    gat = GAT(small_graph.num_features, 16, 2, out_channels=4, heads=2)
    runs = [gp.train(copy.deepcopy(gat), small_graph, "local", stages=2, chunks=4, epochs=EPOCHS,
                     progress=False, history_dtype=d) for d in (torch.float32, torch.bfloat16)]
    fp32, bf16 = (r.history["loss"] for r in runs)
    assert bf16.notna().all() and (fp32 - bf16).abs().max() < 0.02 * fp32.abs().max()


@pytest.mark.parametrize("options", [{"history_dtype": torch.bfloat16},
                                     {"wire_dtype": torch.bfloat16},
                                     {"history_dtype": torch.float16, "wire_dtype": "bfloat16"}])
def test_pipeline_equals_local_with_compact_options(cluster, small_graph, options):
    model = _gcnii(small_graph)
    kwargs = {"stages": 2, "chunks": 8, "epochs": EPOCHS, "progress": False, **options}
    local = gp.train(copy.deepcopy(model), small_graph, "local", **kwargs)
    pipe = gp.train(copy.deepcopy(model), small_graph, "pipeline", cluster=cluster, **kwargs)
    rel = ((pipe.history["loss"] - local.history["loss"]).abs() / local.history["loss"]).max()
    assert rel < 1e-5
    assert pipe.history["val_acc"].tolist() == local.history["val_acc"].tolist()
    wire = options.get("wire_dtype", "float32")
    predicted = gp.comm_volume(model, small_graph, "pipeline", stages=2, wire_dtype=wire)
    assert (pipe.history["comm_bytes"] == predicted).all()
    full = gp.comm_volume(model, small_graph, "pipeline", stages=2)
    assert predicted == (full // 2 if wire != "float32" else full)


def test_a_bf16_wire_rounds_at_the_stage_boundary_in_local(small_graph):
    model = _gcnii(small_graph)
    runs = [gp.train(copy.deepcopy(model), small_graph, "local", stages=2, chunks=4,
                     epochs=EPOCHS, progress=False, wire_dtype=d)
            for d in (torch.float32, torch.bfloat16)]
    fp32, bf16 = (r.history["loss"] for r in runs)
    assert not fp32.equals(bf16) and (fp32 - bf16).abs().max() < 0.02 * fp32.abs().max()
    one_stage = [gp.train(copy.deepcopy(model), small_graph, "local", stages=1, chunks=4,
                          epochs=3, progress=False, wire_dtype=d)
                 for d in (torch.float32, torch.bfloat16)]  # no boundary: nothing to round
    assert one_stage[0].history["loss"].equals(one_stage[1].history["loss"])


def test_graph_halos_on_a_bf16_wire_halve_the_bytes(cluster, small_graph):
    model = gp.models.gcnii(small_graph.num_features, hidden=16, out_dim=4, layers=4, dropout=0.0)
    single = gp.train(copy.deepcopy(model), small_graph, "single", epochs=EPOCHS, progress=False)
    graph = gp.train(copy.deepcopy(model), small_graph, "graph", parts=3, epochs=EPOCHS,
                     cluster=cluster, progress=False, wire_dtype=torch.bfloat16)
    predicted = gp.comm_volume(model, small_graph, "graph", parts=3, wire_dtype="bfloat16")
    assert (graph.history["comm_bytes"] == predicted).all()
    assert predicted * 2 == gp.comm_volume(model, small_graph, "graph", parts=3)
    gap = (graph.history["loss"] - single.history["loss"]).abs().max()
    assert 0 < gap < 0.02 * single.history["loss"].abs().max()  # rounded halos, not exact


def test_hybrid_ways_exchange_compact_rows_as_predicted(cluster, small_graph):
    model = _gcnii(small_graph)
    layout = {"stages": 2, "ways": 2, "chunks": 8}
    sent = {}
    for dtype in (torch.float32, torch.bfloat16):
        run = gp.train(copy.deepcopy(model), small_graph, "hybrid", epochs=2, cluster=cluster,
                       progress=False, history_dtype=dtype, wire_dtype=dtype, **layout)
        sent[dtype] = run.comm.groupby("kind")["bytes"].sum()
        predicted = gp.comm_volume(model, small_graph, "hybrid", history_dtype=dtype,
                                   wire_dtype=dtype, **layout)
        assert (run.history["comm_bytes"] == predicted).all()
        assert run.launch.predicted_comm_bytes == predicted
    for kind in ("boundary", "boundary_grad", "activation", "gradient"):
        assert sent[torch.bfloat16][kind] * 2 == sent[torch.float32][kind] > 0, kind


def test_a_compact_run_resumes_exactly(small_graph, tmp_path):
    model = _gcnii(small_graph)
    kwargs = {"stages": 2, "chunks": 4, "progress": False, "history_dtype": torch.bfloat16}
    full = gp.train(copy.deepcopy(model), small_graph, "local", epochs=6, **kwargs)
    first = copy.deepcopy(model)
    gp.train(first, small_graph, "local", epochs=3, checkpoint=tmp_path, checkpoint_every=3,
             **kwargs)
    shard = ckpt.latest(tmp_path).shards()[0]
    assert {t.dtype for b in shard["buffers"].values() for t in b.values()} == {torch.bfloat16}
    resumed = gp.train(copy.deepcopy(model), small_graph, "local", epochs=6, resume=tmp_path,
                       **kwargs)
    pd.testing.assert_frame_equal(resumed.history[METRICS], full.history[METRICS])


def test_history_dtype_is_checked_and_recorded(small_graph):
    model = _gcnii(small_graph)
    with pytest.raises(ValueError, match=r"history_dtype: expected a torch dtype or name of "
                                         r"\('float32', 'bfloat16', 'float16'\), got torch.int8"):
        gp.train(model, small_graph, "pipeline", stages=2, history_dtype=torch.int8,
                 cluster="tcp://127.0.0.1:1")  # refused before any cluster is contacted
    job = gp.train(model, small_graph, "local", stages=2, chunks=4, epochs=1, progress=False,
                   history_dtype="float16").config
    assert TrainConfig.from_dict(job.to_dict()) == job
    assert job.to_dict()["history_dtype"] == "float16"
    legacy = TrainConfig.from_dict({"mode": "local"})  # saved before the options existed
    assert legacy.history_dtype is legacy.wire_dtype is Precision.FLOAT32
    with pytest.raises(ValueError, match="wire_dtype: expected a torch dtype"):
        gp.train(model, small_graph, "local", wire_dtype="int8")


def test_recompute_keeps_its_aggregations_as_compactly_as_the_history(cluster, small_graph):
    """With a bf16 history the recompute cache is bf16 too (half its memory) and pipeline still
    equals local; with float32 recompute stays exact against no recompute."""
    model = _gcnii(small_graph)
    kwargs = {"stages": 2, "chunks": 4, "epochs": 4, "progress": False, "recompute": True}
    seen: list = []
    original = StageExecutor.end_epoch

    def spy(self):
        seen.extend(b.kept_z.dtype for b in self.buffers.values() if b.kept_z is not None)
        return original(self)

    StageExecutor.end_epoch = spy
    try:
        local = gp.train(copy.deepcopy(model), small_graph, "local", history_dtype="bfloat16",
                         **kwargs)
    finally:
        StageExecutor.end_epoch = original
    assert seen and set(seen) == {torch.bfloat16}
    pipe = gp.train(copy.deepcopy(model), small_graph, "pipeline", cluster=cluster,
                    history_dtype="bfloat16", **kwargs)
    rel = ((pipe.history["loss"] - local.history["loss"]).abs() / local.history["loss"]).max()
    assert rel < 1e-5
    exact = [gp.train(copy.deepcopy(model), small_graph, "local", **{**kwargs, "recompute": r})
             for r in (True, False)]
    assert ((exact[0].history["loss"] - exact[1].history["loss"]).abs() < 1e-5).all()
