"""Accuracy on real data (Cora): the numbers the README quotes. Slow (minutes); run in CI."""

from __future__ import annotations

import copy

import pytest
import torch

import gnnpipe as gp

pytestmark = pytest.mark.slow

GCNII = {"hidden": 64, "out_dim": 7, "layers": 32, "alpha": 0.1, "theta": 0.5, "dropout": 0.6}
OPTIM = {"epochs": 500, "lr": 0.01, "weight_decay": 5e-4, "gnn_weight_decay": 0.01, "seed": 0}


@pytest.fixture(scope="module")
def gcnii_runs(cora):
    torch.manual_seed(0)
    model = gp.models.gcnii(cora.num_features, **GCNII)
    single = gp.train(copy.deepcopy(model), cora, "single", progress=False, **OPTIM)
    local = gp.train(copy.deepcopy(model), cora, "local", stages=2, chunks=8, progress=False,
                     **OPTIM)
    return single, local


def test_gcnii_32_single_reaches_the_reference_accuracy(gcnii_runs):
    single, _ = gcnii_runs
    assert single.best["test_acc"] >= 0.84, single.best


def test_gcnii_32_local_2_stages_8_chunks_within_1_5_points_of_single(gcnii_runs):
    single, local = gcnii_runs
    assert abs(local.best["test_acc"] - single.best["test_acc"]) <= 0.015, (single.best, local.best)


def test_two_layer_gcn_reaches_80_percent(cora):
    model = gp.models.gcn(cora.num_features, hidden=64, out_dim=7, layers=2, dropout=0.5)
    run = gp.train(model, cora, "single", epochs=200, lr=0.01, weight_decay=5e-4, progress=False)
    assert run.best["test_acc"] >= 0.80, run.best
