"""gp.train: argument checks, determinism, the Run it returns, saved results."""

from __future__ import annotations

import copy
import json

import pandas as pd
import pytest
import torch

import gnnpipe as gp


@pytest.fixture
def model(small_graph):
    return gp.models.gcn(small_graph.num_features, hidden=8, out_dim=4, layers=2)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"mode": "turbo"}, ValueError, "mode: unknown mode 'turbo'"),
    ({"epochs": 0}, ValueError, "epochs: expected a positive integer"),
    ({"epochs": 2.5}, ValueError, "epochs"),
    ({"lr": 0}, ValueError, "lr: expected a positive number"),
    ({"weight_decay": -1}, ValueError, "weight_decay"),
    ({"mode": "local", "stages": 0}, ValueError, "stages: expected a positive integer"),
    ({"mode": "local", "stages": 3}, ValueError, "stages: 3 stages need at least as many blocks"),
    ({"mode": "local", "chunks": 601}, ValueError, "chunks: 601 chunks exceed the graph's 600 nodes"),
    ({"eval_every": 0}, ValueError, "eval_every: expected a positive integer"),
    ({"device": "tpu"}, ValueError, "device: expected one of"),
    ({"mode": "local", "ways": 2}, ValueError, "ways: 2 pipelines side by side is mode='hybrid'"),
])
def test_bad_arguments_raise_clear_errors(model, small_graph, kwargs, error, match):
    with pytest.raises(error, match=match):
        gp.train(model, small_graph, progress=False, **kwargs)


def test_layers_below_one_are_rejected():
    with pytest.raises(ValueError, match="layers"):
        gp.models.gcnii(8, layers=0)


def test_model_must_be_a_layer_stack(small_graph):
    with pytest.raises(TypeError, match="model: expected a gnnpipe LayerStack"):
        gp.train(torch.nn.Linear(24, 4), small_graph, progress=False)


def test_model_width_must_match_the_features(small_graph):
    with pytest.raises(ValueError, match="input width 10 does not match data.x's 24"):
        gp.train(gp.models.gcn(10, out_dim=4), small_graph, progress=False)


def test_bad_data_is_rejected_before_training(model, small_graph):
    broken = small_graph.clone()
    broken.x = broken.x.clone()
    broken.x[0, 0] = float("nan")
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match="data.x: contains NaN"):
        gp.train(model, broken, progress=False)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_training_is_deterministic_per_seed(model, small_graph):
    runs = [gp.train(copy.deepcopy(model), small_graph, "local", chunks=4, epochs=5, seed=s,
                     progress=False) for s in (1, 1, 2)]
    assert runs[0].history["loss"].tolist() == runs[1].history["loss"].tolist()
    assert runs[0].history["loss"].tolist() != runs[2].history["loss"].tolist()


@pytest.mark.parametrize("mode", ["single", "local"])
def test_eval_every_skips_evaluations_without_changing_training(model, small_graph, mode):
    every = gp.train(copy.deepcopy(model), small_graph, mode, epochs=7, progress=False)
    sparse = gp.train(copy.deepcopy(model), small_graph, mode, epochs=7, eval_every=3,
                      progress=False)
    assert sparse.history["loss"].tolist() == every.history["loss"].tolist()
    evaluated = sparse.history.dropna(subset=["val_acc"])
    assert evaluated["epoch"].tolist() == [2, 5, 6]  # every third epoch and the last
    assert sparse.history["test_acc"].isna().sum() == 4
    pd.testing.assert_frame_equal(evaluated.drop(columns="epoch_time"),
                                  every.history.loc[[2, 5, 6]].drop(columns="epoch_time"))
    assert sparse.best["epoch"] in (2, 5, 6)


def test_run_reports_history_best_and_saves(model, small_graph, tmp_path):
    run = gp.train(model, small_graph, epochs=30, lr=0.05, progress=False)
    h = run.history
    assert list(h.columns) == ["epoch", "loss", "train_acc", "val_acc", "test_acc", "val_loss",
                               "epoch_time", "comm_bytes"]
    assert h["epoch"].tolist() == list(range(30))
    assert h["loss"].iloc[-1] < h["loss"].iloc[0]
    best = run.best
    row = h[h["epoch"] == best["epoch"]].iloc[0]
    assert best["val_acc"] == row["val_acc"] == h["val_acc"].max()
    assert best["test_acc"] == row["test_acc"] and best["test_acc"] > 0.5
    folder = run.save(tmp_path / "run")
    assert json.loads((folder / "config.json").read_text())["mode"] == "single"
    assert len((folder / "history.csv").read_text().splitlines()) == 31
    trace = json.loads((folder / "trace.json").read_text())
    assert "traceEvents" in trace


def test_cuda_without_a_gpu_is_a_clear_error(model, small_graph, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="device: 'cuda' asked, but torch sees no GPU"):
        gp.train(model, small_graph, device="cuda", progress=False)
