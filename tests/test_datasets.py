"""Datasets: Planetoid loading from the data root, synthetic graphs, validation errors."""

from __future__ import annotations

import os
import stat

import pytest
import torch

import gnnpipe as gp
from gnnpipe.datasets import validate


def test_cora_has_the_public_split(cora):
    assert (cora.num_nodes, cora.num_edges, cora.num_features) == (2708, 10556, 1433)
    assert int(cora.y.max()) + 1 == 7
    assert [int(m.sum()) for m in (cora.train_mask, cora.val_mask, cora.test_mask)] == [140, 500, 1000]
    assert torch.allclose(cora.x.sum(1)[cora.x.sum(1) > 0], torch.tensor(1.0))  # row-normalised


def test_read_only_root_loads_without_writing_anything(tmp_path, monkeypatch):
    src = gp.datasets.default_root() / "Cora" / "raw"
    root = tmp_path / "ro"
    (root / "Cora" / "raw").mkdir(parents=True)
    for f in src.iterdir():
        (root / "Cora" / "raw" / f.name).write_bytes(f.read_bytes())
    for d in (root / "Cora", root):
        d.chmod(stat.S_IRUSR | stat.S_IXUSR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    try:
        data = gp.datasets.load("Cora", root=root)
    finally:
        for d in (root, root / "Cora"):
            d.chmod(stat.S_IRWXU)
    assert data.num_nodes == 2708
    assert not (root / "Cora" / "processed").exists()
    assert not (tmp_path / "cache").exists()  # built from raw/ each time: no cache to trust


def test_gnnpipe_data_env_sets_the_root(monkeypatch, tmp_path):
    monkeypatch.setenv("GNNPIPE_DATA", str(tmp_path))
    assert gp.datasets.default_root() == tmp_path / "planetoid"
    assert os.fspath(gp.datasets.default_root("facebook")) == str(tmp_path)
    monkeypatch.delenv("GNNPIPE_DATA")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert gp.datasets.default_root("squirrel") == tmp_path / "cache" / "gnnpipe"


def test_unknown_dataset_names_the_argument():
    with pytest.raises(ValueError, match="name: unknown dataset 'nope'"):
        gp.datasets.load("nope")


def test_synthetic_is_deterministic_and_homophilous():
    a = gp.datasets.synthetic(5000, avg_degree=10, num_classes=5, num_features=8, homophily=0.7, seed=1)
    b = gp.datasets.synthetic(5000, avg_degree=10, num_classes=5, num_features=8, homophily=0.7, seed=1)
    c = gp.datasets.synthetic(5000, avg_degree=10, num_classes=5, num_features=8, homophily=0.7, seed=2)
    assert torch.equal(a.edge_index, b.edge_index) and torch.equal(a.x, b.x)
    assert not torch.equal(a.edge_index, c.edge_index)
    src, dst = a.edge_index
    assert abs(float((a.y[src] == a.y[dst]).float().mean()) - 0.7) < 0.03
    assert abs(a.num_edges / a.num_nodes - 10) < 0.5
    assert torch.equal(a.edge_index, a.edge_index.flip(0)[:, torch.argsort(
        a.edge_index[1] * 5000 + a.edge_index[0])])  # symmetric
    masks = a.train_mask.int() + a.val_mask.int() + a.test_mask.int()
    assert bool((masks == 1).all())
    validate(a)


@pytest.mark.parametrize("kwargs, match", [
    ({"num_nodes": 1}, "num_nodes"),
    ({"num_classes": 1}, "num_classes"),
    ({"homophily": 1.5}, "homophily"),
    ({"avg_degree": 0}, "avg_degree"),
    ({"train_frac": 0.9, "val_frac": 0.2}, "train_frac"),
])
def test_synthetic_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        gp.datasets.synthetic(**{"num_nodes": 100, **kwargs})


def _broken(data, **changes):
    data = data.clone()
    for key, value in changes.items():
        setattr(data, key, value)
    return data


@pytest.mark.parametrize("change, match", [
    (lambda d: {"edge_index": d.edge_index.clone().index_fill_(1, torch.tensor([0]), d.num_nodes)},
     r"edge_index: node ids must lie in \[0, 600\)"),
    (lambda d: {"edge_index": d.edge_index.clone().index_fill_(1, torch.tensor([0]), -1)},
     "edge_index: node ids"),
    (lambda d: {"edge_index": d.edge_index.float()}, "edge_index: expected dtype torch.long"),
    (lambda d: {"edge_index": d.edge_index[0]}, r"edge_index: expected a tensor of shape \[2"),
    (lambda d: {"x": d.x.clone().index_fill_(0, torch.tensor([3]), float("nan"))}, "x: contains NaN"),
    (lambda d: {"x": d.x.clone().index_fill_(0, torch.tensor([3]), float("inf"))}, "x: contains NaN or inf"),
    (lambda d: {"x": d.x.long()}, "x: expected a floating-point dtype"),
    (lambda d: {"y": d.y[:-1]}, "y: expected a 1-D label tensor of length 600"),
    (lambda d: {"y": d.y.float()}, "y: expected dtype torch.long"),
    (lambda d: {"train_mask": d.train_mask[:10]}, "train_mask: expected a 1-D boolean tensor of length 600"),
    (lambda d: {"val_mask": d.val_mask.long()}, "val_mask: expected dtype torch.bool"),
    (lambda d: {"test_mask": None}, "test_mask"),
    (lambda d: {"train_mask": torch.zeros_like(d.train_mask)}, "train_mask: is empty"),
])
def test_validate_names_the_broken_field(small_graph, change, match):
    with pytest.raises(ValueError, match=match):
        validate(_broken(small_graph, **change(small_graph)))


def test_validate_rejects_non_data():
    with pytest.raises(TypeError, match="data: expected a torch_geometric.data.Data"):
        validate({"x": 1})
