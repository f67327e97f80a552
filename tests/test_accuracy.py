"""Accuracy on real data (Cora): the numbers the README quotes. Slow (minutes); run in CI."""

from __future__ import annotations

import copy
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import pytest
import torch

import gnnpipe as gp

pytestmark = pytest.mark.slow

GCNII = {"hidden": 64, "out_dim": 7, "layers": 32, "alpha": 0.1, "theta": 0.5, "dropout": 0.6}
OPTIM = {"epochs": 500, "lr": 0.01, "weight_decay": 5e-4, "gnn_weight_decay": 0.01, "seed": 0}


def _train_best(model: gp.models.LayerStack, mode: str, kwargs: dict) -> dict:
    torch.set_num_threads(1)
    return gp.train(model, gp.datasets.load("cora"), mode, progress=False, **kwargs).best


@pytest.fixture(scope="module")
def gcnii_runs(cora):
    """Best-validation metrics of ``single`` and ``local`` (2 stages, 8 chunks), the two 500-epoch
    runs side by side: ``local`` in a spawned process, ``single`` here."""
    torch.manual_seed(0)
    model = gp.models.gcnii(cora.num_features, **GCNII)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        local = pool.submit(_train_best, copy.deepcopy(model), "local",
                            {"stages": 2, "chunks": 8, **OPTIM})
        single = _train_best(copy.deepcopy(model), "single", OPTIM)
        return single, local.result()


def test_gcnii_32_single_reaches_the_reference_accuracy(gcnii_runs):
    single, _ = gcnii_runs
    assert single["test_acc"] >= 0.84, single


def test_gcnii_32_local_2_stages_8_chunks_within_1_5_points_of_single(gcnii_runs):
    single, local = gcnii_runs
    assert abs(local["test_acc"] - single["test_acc"]) <= 0.015, (single, local)


def test_two_layer_gcn_reaches_80_percent(cora):
    model = gp.models.gcn(cora.num_features, hidden=64, out_dim=7, layers=2, dropout=0.5)
    run = gp.train(model, cora, "single", epochs=200, lr=0.01, weight_decay=5e-4, progress=False)
    assert run.best["test_acc"] >= 0.80, run.best
