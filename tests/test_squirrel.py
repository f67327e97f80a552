"""The Squirrel loader: the paper's graph and split, read without running code."""

from __future__ import annotations

import numpy as np
import pytest

import gnnpipe as gp


@pytest.fixture(scope="module")
def squirrel():
    return gp.datasets.load("squirrel")


def test_squirrel_is_the_papers_graph_and_split(squirrel):
    assert squirrel.num_nodes == 5201 and squirrel.num_features == 2089
    assert gp.datasets.num_classes(squirrel) == 5
    # 198,353 undirected edges, both directions; with self-loops the GNNPipe logs count 401,907
    assert squirrel.edge_index.size(1) == 2 * 198_353
    assert 2 * 198_353 + squirrel.num_nodes == 401_907
    assert not bool((squirrel.edge_index[0] == squirrel.edge_index[1]).any())
    sizes = [int(m.sum()) for m in (squirrel.train_mask, squirrel.val_mask, squirrel.test_mask)]
    assert sizes == [2496, 1664, 1041] and squirrel.name == "squirrel"


def test_each_split_is_the_releases(squirrel):
    raw = np.load(gp.datasets.default_root("squirrel") / "heterophilous" / "squirrel.npz")
    assert squirrel.train_mask.numpy().tolist() == raw["train_masks"][0].tolist()
    third = gp.datasets.load("squirrel", split=3)
    assert third.test_mask.numpy().tolist() == raw["test_masks"][3].tolist()
    assert third.train_mask.tolist() != squirrel.train_mask.tolist()


def test_features_are_kept_as_released_unless_asked(squirrel):
    """Row-normalised, Squirrel's binary features stop a GCNII-16 training (benchmarks/
    squirrel.py); its default keeps them as released, while Cora's stay row-normalised."""
    raw = np.load(gp.datasets.default_root("squirrel") / "heterophilous" / "squirrel.npz")
    assert np.array_equal(squirrel.x.numpy(), raw["node_features"])
    normalised = gp.datasets.load("squirrel", normalize_features=True).x
    rows = normalised.sum(1)
    assert np.allclose(rows[rows > 0].numpy(), 1.0, atol=1e-5)
    cora = gp.datasets.load("cora").x.sum(1)
    assert np.allclose(cora[cora > 0].numpy(), 1.0, atol=1e-5)


def test_bad_split_and_seed_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"split: expected an integer in \[0, 10\), got 10"):
        gp.datasets.load("squirrel", split=10)
    with pytest.raises(ValueError, match="split: cora has one split"):
        gp.datasets.load("cora", split=1)
    with pytest.raises(ValueError, match="seed: squirrel's splits are published"):
        gp.datasets.load("squirrel", seed=1)
    with pytest.raises(OSError, match="squirrel: could not download .*squirrel.npz .*put "
                                      "squirrel.npz in .*heterophilous by hand"):
        gp.datasets.load("squirrel", root=tmp_path)  # the suite's downloads are refused
    assert list(tmp_path.iterdir()) == []


def test_a_pickled_array_is_refused(tmp_path):
    folder = tmp_path / "heterophilous"
    folder.mkdir()
    arrays = {name: np.zeros(2) for name in ("node_labels", "edges", "train_masks", "val_masks",
                                             "test_masks")}
    np.savez(folder / "squirrel.npz", node_features=np.array([{"x": 1}], dtype=object), **arrays)
    with pytest.raises(ValueError, match="allow_pickle"):
        gp.datasets.load("squirrel", root=tmp_path)


def test_pipeline_bytes_equal_the_papers_logs(squirrel):
    """The GNNPipe logs' per-epoch bytes on Squirrel, 32 layers of width 1,000 on 8 stages:
    0.271 GiB for GCN, 0.543 GiB for GCNII (its h0 crosses every boundary beside h)."""
    gib = {}
    for name in ("gcn", "gcnii"):
        model = gp.models.MODELS[name](squirrel.num_features, hidden=1000, out_dim=5, layers=32)
        gib[name] = gp.comm_volume(model, squirrel, "pipeline", stages=8) / 2**30
    assert round(gib["gcn"], 3) == 0.271 and round(gib["gcnii"], 3) == 0.543
