"""The Squirrel Wikipedia graph of the GNNPipe paper's experiments, as released with "A critical
look at the evaluation of GNNs under heterophily" (Platonov et al., ICLR 2023): one ``.npz`` of
plain arrays, read without running any code (``allow_pickle=False``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch_geometric.data import Data
from torch_geometric.utils import to_undirected

__all__ = ["ARRAYS", "FILE", "FOLDER", "NUM_SPLITS", "read_squirrel"]

FOLDER = "heterophilous"
FILE = "squirrel.npz"
#: The arrays the file holds (``numpy.load`` names).
ARRAYS = ("node_features", "node_labels", "edges", "train_masks", "val_masks", "test_masks")
#: The release's ten train/val/test splits; split 0 is the GNNPipe paper's.
NUM_SPLITS = 10


def read_squirrel(root: Path, split: int = 0) -> Data:
    """The graph in ``root/heterophilous/squirrel.npz``: 5,201 nodes, its 198,353 undirected
    edges in both directions (no self-loops), 2,089 features, 5 classes, and the masks of the
    release's ``split`` (0: 2,496 train / 1,664 validation / 1,041 test, the paper's)."""
    path = Path(root) / FOLDER / FILE
    if not path.is_file():
        raise FileNotFoundError(f"root: no {FOLDER}/{FILE} in {root}; expected the Squirrel "
                                "file of yandex-research/heterophilous-graphs (data/)")
    with np.load(path, allow_pickle=False) as npz:
        if missing := [a for a in ARRAYS if a not in npz.files]:
            raise ValueError(f"root: {path} lacks the arrays {missing}; expected {ARRAYS}")
        arrays = {a: npz[a] for a in ARRAYS}
    if not 0 <= split < arrays["train_masks"].shape[0]:
        raise ValueError(f"split: expected an integer in [0, {arrays['train_masks'].shape[0]}), "
                         f"got {split}")
    n = arrays["node_labels"].shape[0]
    edges = torch.from_numpy(arrays["edges"].astype(np.int64)).t().contiguous()
    data = Data(x=torch.from_numpy(arrays["node_features"].astype(np.float32)),
                y=torch.from_numpy(arrays["node_labels"].astype(np.int64)),
                edge_index=to_undirected(edges, num_nodes=n),
                train_mask=torch.from_numpy(arrays["train_masks"][split].astype(bool)),
                val_mask=torch.from_numpy(arrays["val_masks"][split].astype(bool)),
                test_mask=torch.from_numpy(arrays["test_masks"][split].astype(bool)))
    data.name = "squirrel"
    return data
