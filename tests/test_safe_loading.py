"""Loading data runs no code: crafted Planetoid pickles are refused before anything in them runs,
a crafted ``processed/data.pt`` is never read, and the safe reader builds PyG's exact graph."""

from __future__ import annotations

import builtins
import os
import pickle
import re
import shutil

import pytest
import torch

import gnnpipe as gp


class _Payload:
    """Unpickling this calls ``func(*args)``: what a crafted file would do."""

    def __init__(self, func, *args) -> None:
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


@pytest.fixture
def root(tmp_path):
    """A writable copy of the shared Cora raw files."""
    raw = gp.datasets.default_root() / "Cora" / "raw"
    shutil.copytree(raw, tmp_path / "data" / "Cora" / "raw")
    return tmp_path / "data"


def _payloads(marker):
    return {
        "posix.system": _Payload(os.system, f"touch {marker}"),
        "builtins.exec": _Payload(builtins.exec, f"open({str(marker)!r}, 'w').close()"),
    }


@pytest.mark.parametrize("file", ["x", "graph", "ally"])
@pytest.mark.parametrize("refused", ["posix.system", "builtins.exec"])
def test_a_crafted_raw_file_is_refused_and_runs_nothing(root, tmp_path, file, refused):
    marker = tmp_path / "MARKER"
    target = root / "Cora" / "raw" / f"ind.cora.{file}"
    target.write_bytes(pickle.dumps(_payloads(marker)[refused]))
    with pytest.raises(ValueError, match=rf"root: {re.escape(str(target))} is not a Planetoid file: it references "
                                         rf"{refused}, refused"):
        gp.datasets.load("cora", root=root)
    assert not marker.exists()


def test_a_raw_file_of_the_wrong_shape_is_named(root):
    target = root / "Cora" / "raw" / "ind.cora.tx"
    target.write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(ValueError, match=rf"root: {re.escape(str(target))} is not a Planetoid file: expected a 2-D"):
        gp.datasets.load("cora", root=root)
    target.write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match=rf"root: {re.escape(str(target))} is not a Planetoid file"):
        gp.datasets.load("cora", root=root)


def test_a_crafted_processed_cache_is_never_read(root, tmp_path):
    marker = tmp_path / "MARKER"
    (root / "Cora" / "processed").mkdir()
    for name in ("data.pt", "pre_filter.pt", "pre_transform.pt"):
        torch.save(_Payload(os.system, f"touch {marker}"), root / "Cora" / "processed" / name)
    data = gp.datasets.load("cora", root=root)
    assert not marker.exists()
    assert data.num_nodes == 2708 and int(data.train_mask.sum()) == 140


def test_the_safe_reader_builds_pyg_s_exact_graph():
    from torch_geometric.io import read_planetoid_data
    from torch_geometric.transforms import NormalizeFeatures

    raw = gp.datasets.default_root() / "Cora" / "raw"  # trusted files: PyG's pickle reader is fine
    expected = NormalizeFeatures()(read_planetoid_data(str(raw), "Cora"))
    data = gp.datasets.load("cora")
    for key in ("x", "y", "edge_index", "train_mask", "val_mask", "test_mask"):
        assert data[key].dtype == expected[key].dtype and torch.equal(data[key], expected[key]), key
