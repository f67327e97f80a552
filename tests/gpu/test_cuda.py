"""GPU checks (``-m gpu``; deselected by default, since CI has no GPU): one-process and
distributed modes on CUDA equal the same run on the CPU."""

from __future__ import annotations

import copy

import pytest
import torch

import gnnpipe as gp

pytestmark = pytest.mark.gpu

EPOCHS = 5


def _rel(a, b) -> float:
    a, b = torch.tensor(a.to_numpy()), torch.tensor(b.to_numpy())
    return float(((a - b).abs() / b.abs()).max())


@pytest.fixture(scope="module")
def gcnii(small_graph):
    if not torch.cuda.is_available():
        pytest.fail("-m gpu needs a GPU that torch can see")
    return gp.models.gcnii(small_graph.num_features, hidden=16, out_dim=4, layers=6, dropout=0.0)


@pytest.mark.parametrize("mode, kwargs", [("single", {}), ("local", {"stages": 2, "chunks": 4})])
def test_one_process_modes_on_cuda_equal_cpu(small_graph, gcnii, mode, kwargs):
    cpu = gp.train(copy.deepcopy(gcnii), small_graph, mode, epochs=EPOCHS, progress=False, **kwargs)
    model = copy.deepcopy(gcnii)
    gpu = gp.train(model, small_graph, mode, epochs=EPOCHS, device="cuda", progress=False,
                   **kwargs)
    assert next(model.parameters()).is_cuda and not small_graph.x.is_cuda
    assert _rel(gpu.history["loss"], cpu.history["loss"]) < 1e-4
    assert (gpu.history["val_acc"] - cpu.history["val_acc"]).abs().max() < 0.01


@pytest.mark.parametrize("mode, kwargs", [
    ("pipeline", {"stages": 1, "chunks": 4}),
    ("graph", {"parts": 1}),
    ("hybrid", {"stages": 1, "ways": 1, "chunks": 4}),
])
def test_one_rank_per_gpu_with_nccl_equals_cpu(small_graph, gcnii, mode, kwargs):
    world = torch.cuda.device_count()
    reference = "single" if mode == "graph" else "local"
    ref_kwargs = {} if mode == "graph" else {"chunks": 4}
    cpu = gp.train(copy.deepcopy(gcnii), small_graph, reference, epochs=EPOCHS, progress=False,
                   **ref_kwargs)
    with gp.Cluster(n_workers=world) as cluster:
        gpu = gp.train(copy.deepcopy(gcnii), small_graph, mode, epochs=EPOCHS, device="cuda",
                       cluster=cluster, progress=False, **kwargs)
    assert _rel(gpu.history["loss"], cpu.history["loss"]) < 1e-4
    assert gpu.config.device == "cuda"


def test_two_stage_pipeline_over_nccl(small_graph, gcnii):
    """With two GPUs the pipeline equals ``local``; with one, NCCL could not run two ranks on it,
    so the run is refused before any rank starts."""
    local = gp.train(copy.deepcopy(gcnii), small_graph, "local", stages=2, chunks=4,
                     epochs=EPOCHS, progress=False)
    with gp.Cluster(n_workers=2) as cluster:
        run = lambda: gp.train(copy.deepcopy(gcnii), small_graph, "pipeline", stages=2,
                               chunks=4, epochs=EPOCHS, device="cuda", cluster=cluster,
                               progress=False)
        if torch.cuda.device_count() < 2:
            with pytest.raises(ValueError, match="device: ranks 0 and 1 would share GPU"):
                run()
            return
        pipe = run()
    assert _rel(pipe.history["loss"], local.history["loss"]) < 1e-4
    assert (pipe.history["comm_bytes"] == gp.comm_volume(gcnii, small_graph, "pipeline",
                                                         stages=2)).all()


def test_gpu_timeline_spans_the_work(small_graph, gcnii):
    """Chunk ops are timed after their kernels finish: per epoch, the ops cover most of the
    training epoch and never more than it."""
    run = gp.train(copy.deepcopy(gcnii), small_graph, "local", stages=2, chunks=4, epochs=EPOCHS,
                   device="cuda", progress=False)
    df = run.timeline.df
    busy = (df["end"] - df["start"]).groupby(df["epoch"]).sum()
    epoch = run.history.set_index("epoch")["epoch_time"]
    assert (df["end"] >= df["start"]).all()
    assert ((busy / epoch).iloc[1:] > 0.5).all() and ((busy / epoch) < 1.0).all()
