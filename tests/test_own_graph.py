"""Graphs beyond Planetoid: the Facebook Page-Page graph, and a user's own graph into gp.train,
gp.plan and gp.comm_volume (a PyG Dataset, OGB-style split_idx, split="random")."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_geometric.data import Data, InMemoryDataset
from torch_geometric.utils import contains_self_loops, is_undirected

import gnnpipe as gp
from gnnpipe.datasets.facebook import CLASSES
from gnnpipe.plan.profile import profile_model


@pytest.fixture(scope="module")
def facebook():
    return gp.datasets.load("facebook")


class Graphs(InMemoryDataset):
    """An in-memory PyG Dataset of the given graphs (no files)."""

    def __init__(self, graphs: list[Data]) -> None:
        super().__init__()
        self._data, self.slices = self.collate(graphs)


def _bare(graph: Data) -> Data:
    """``graph`` without masks."""
    return Data(x=graph.x, edge_index=graph.edge_index, y=graph.y)


def _model(graph: Data) -> gp.models.LayerStack:
    return gp.models.gcn(graph.num_features, hidden=8, out_dim=int(graph.y.max()) + 1, layers=2)


def _masks(data: Data) -> list[torch.Tensor]:
    return [data.train_mask, data.val_mask, data.test_mask]


# ----------------------------------------------------------------------------------- Facebook
def test_facebook_sizes_classes_and_split(facebook):
    assert (facebook.num_nodes, facebook.num_features, facebook.name) == (22470, 4714, "facebook")
    assert facebook.num_edges == 2 * (171_002 - 179)  # both directions, self-loops dropped
    assert is_undirected(facebook.edge_index) and not contains_self_loops(facebook.edge_index)
    assert facebook.y.dtype == torch.int64 and facebook.x.dtype == torch.float32
    counts = dict(zip(CLASSES, facebook.y.bincount().tolist()))
    assert counts == {"government": 6880, "company": 6495, "politician": 5768, "tvshow": 3327}
    train, val, test = _masks(facebook)
    assert [int(m.sum()) for m in (train, val, test)] == [80, 500, 1000]
    assert facebook.y[train].bincount().tolist() == [20, 20, 20, 20]
    assert not (train & val).any() and not (train & test).any() and not (val & test).any()
    assert torch.isfinite(facebook.x).all()
    assert torch.allclose(facebook.x.sum(1), torch.tensor(1.0))  # row-normalised, none empty


def test_facebook_split_is_seeded(facebook):
    again, other = gp.datasets.load("facebook"), gp.datasets.load("facebook", seed=1)
    assert all(torch.equal(a, b) for a, b in zip(_masks(again), _masks(facebook)))
    assert not torch.equal(other.train_mask, facebook.train_mask)
    assert int(other.test_mask.sum()) == 1000 and torch.equal(other.x, facebook.x)


def test_facebook_root_and_seed_are_checked(tmp_path, monkeypatch):
    # an empty root: the download is tried (the suite's GNNPIPE_DATA_URL refuses it) and fails
    # naming the address and where the files go, leaving nothing behind
    with pytest.raises(OSError, match=r"facebook: could not download \S+facebook_large.zip .*put "
                                      r"facebook_edges.csv, facebook_target.csv, facebook.json in "):
        gp.datasets.load("facebook", root=tmp_path)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("GNNPIPE_DATA", str(tmp_path))
    assert gp.datasets.default_root("facebook") == tmp_path
    with pytest.raises(ValueError, match="seed: cora has a fixed public split"):
        gp.datasets.load("cora", seed=1)


def test_facebook_trains_single_and_local(facebook):
    for mode in ("single", "local"):
        model = gp.models.gcn(4714, hidden=16, out_dim=4, layers=2)
        run = gp.train(model, facebook, mode, epochs=2, progress=False)
        assert len(run.history) == 2 and np.isfinite(run.history["loss"]).all()
        assert run.config.dataset == "facebook"


# ----------------------------------------------------------------------------- your own graph
def test_a_dataset_of_one_graph_trains_and_of_two_is_refused(small_graph):
    dataset = Graphs([small_graph])
    run = gp.train(_model(small_graph), dataset, "single", epochs=2, progress=False)
    assert all(torch.equal(a, b) for a, b in zip(_masks(run.data), _masks(small_graph)))
    model = _model(small_graph)
    assert gp.comm_volume(model, dataset, "pipeline", stages=2) == gp.comm_volume(
        model, small_graph, "pipeline", stages=2)
    with pytest.raises(ValueError, match="data: expected a Dataset of one graph .* got 2 graphs"):
        gp.train(_model(small_graph), Graphs([small_graph] * 2), "single", epochs=1)


def test_split_idx_becomes_masks_and_the_callers_graph_is_kept(small_graph):
    graph = _bare(small_graph)
    graph.y = small_graph.y.view(-1, 1)  # OGB-style labels
    ids = torch.randperm(600)
    split_idx = {"train": ids[:100], "valid": ids[100:250].numpy(), "test": ids[250:].tolist()}
    run = gp.train(_model(small_graph), graph, "local", epochs=2, progress=False, split=split_idx)
    for mask, part in zip(_masks(run.data), (ids[:100], ids[100:250], ids[250:])):
        assert torch.equal(mask.nonzero().view(-1), part.sort().values)
    assert torch.equal(run.data.y, small_graph.y)
    assert "train_mask" not in graph and graph.y.shape == (600, 1)  # untouched

    graph.split_idx = split_idx  # stored on the graph, as after dataset.get_idx_split()
    ready = gp.datasets.prepare_data(graph)
    assert torch.equal(ready.val_mask, run.data.val_mask) and "split_idx" not in ready
    assert "split_idx" in graph


def test_plan_profiles_a_dataset_whose_graph_stores_its_split(small_graph):
    graph = _bare(small_graph)
    graph.split_idx = {"train": torch.arange(100), "valid": torch.arange(100, 200),
                       "test": torch.arange(200, 600)}
    profile = profile_model(_model(small_graph), Graphs([graph]), chunks=4, repeats=1)
    assert profile.num_nodes == 600 and len(profile.blocks) == 2


def test_a_graph_without_masks_gets_the_hint(small_graph):
    with pytest.raises(ValueError, match="data: the graph has no train_mask/val_mask/test_mask; "
                                         "pass split="):
        gp.train(_model(small_graph), _bare(small_graph), "single", epochs=1)


def test_random_split_is_seeded_disjoint_and_sized(small_graph):
    graph = _bare(small_graph)
    graph.x = graph.x.double()  # converted to float32 on the way in
    a = gp.train(_model(small_graph), graph, "single", epochs=2, progress=False, split="random").data
    b = gp.datasets.prepare_data(graph, "random", seed=0)
    c = gp.datasets.prepare_data(graph, "random", seed=1)
    assert a.x.dtype == torch.float32 and graph.x.dtype == torch.float64
    assert [int(m.sum()) for m in _masks(a)] == [360, 120, 120]
    assert not (a.train_mask & a.val_mask).any() and not (a.val_mask & a.test_mask).any()
    assert all(torch.equal(x, y) for x, y in zip(_masks(a), _masks(b)))
    assert not torch.equal(b.train_mask, c.train_mask)
    shares = gp.datasets.prepare_data(graph, {"train": 0.1, "val": 0.1, "test": 0.5})
    assert [int(m.sum()) for m in _masks(shares)] == [60, 60, 300]


@pytest.mark.parametrize(("split", "error", "match"), [
    ("stratified", ValueError, "split: expected 'random' or a dict"),
    (0.6, TypeError, "split: expected 'random' or a dict"),
    ({"train": [0], "test": [1]}, ValueError, "split: expected the keys 'train', 'valid'"),
    ({"train": 0.6, "val": 0.3, "test": 0.3}, ValueError, "split: expected shares summing"),
    ({"train": 0.6, "val": 0.2, "test": 0.0}, ValueError, r"split\['test'\]: expected a positive"),
    ({"train": [0, 600], "valid": [1], "test": [2]}, ValueError,
     r"split\['train'\]: node ids must lie in \[0, 600\), found \[0, 600\]"),
    ({"train": [0.5], "valid": [1], "test": [2]}, TypeError, r"split\['train'\]: expected integer"),
    ({"train": [], "valid": [1], "test": [2]}, ValueError, r"split\['train'\]: is empty"),
    ({"train": [0, 1], "valid": [1], "test": [2]}, ValueError, "data.val_mask: expected no train"),
])
def test_bad_splits_name_the_argument(small_graph, split, error, match):
    with pytest.raises(error, match=match):
        gp.train(_model(small_graph), _bare(small_graph), "single", epochs=1, split=split)
