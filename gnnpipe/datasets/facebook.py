"""The Facebook Page-Page graph of the MUSAE release (Rozemberczki et al., "Multi-scale
Attributed Node Embedding", 2021), read from its csv and json files without running any code."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch_geometric.data import Data
from torch_geometric.utils import remove_self_loops, to_undirected

from gnnpipe.datasets.splits import stratified_masks

__all__ = ["CLASSES", "FILES", "FOLDER", "read_facebook"]

FOLDER = "musae-facebook"
FILES = ("facebook_edges.csv", "facebook_target.csv", "facebook.json")
#: ``y``'s class ids: the ``page_type`` values in alphabetical order.
CLASSES = ("company", "government", "politician", "tvshow")
#: The seeded Planetoid-style split: training nodes per class, validation and test nodes.
TRAIN_PER_CLASS, NUM_VAL, NUM_TEST = 20, 500, 1000


def read_facebook(root: Path, seed: int = 0) -> Data:
    """The graph in ``root/musae-facebook/``: undirected edges without self-loops, binary
    features (one column per feature id), ``y`` by :data:`CLASSES`, and the split of
    :func:`~gnnpipe.datasets.splits.stratified_masks` (20 per class, 500, 1,000) for ``seed``."""
    folder = Path(root) / FOLDER
    if missing := [f for f in FILES if not (folder / f).is_file()]:
        raise FileNotFoundError(
            f"root: {folder} lacks {', '.join(missing)}; expected the MUSAE Facebook files "
            f"{', '.join(FILES)} (github.com/benedekrozemberczki/MUSAE, input/)")
    y = _labels(folder / FILES[1])
    n = y.numel()
    edges = _edges(folder / FILES[0], n)
    edge_index, _ = remove_self_loops(edges)
    data = Data(x=_features(folder / FILES[2], n), edge_index=to_undirected(edge_index, num_nodes=n),
                y=y, **stratified_masks(y, TRAIN_PER_CLASS, NUM_VAL, NUM_TEST, seed))
    data.name = "facebook"
    return data


def _columns(path: Path, columns: list[str], **kwargs: object) -> pd.DataFrame:
    try:
        return pd.read_csv(path, usecols=columns, **kwargs)
    except ValueError as err:
        raise ValueError(f"root: {path} is not a MUSAE file: expected the columns {columns} "
                         f"({err})") from None


def _labels(path: Path) -> torch.Tensor:
    """``page_type`` as class ids, indexed by the ``id`` column (ids must be ``0..n-1``)."""
    table = _columns(path, ["id", "page_type"], dtype={"id": np.int64, "page_type": str})
    ids, n = table["id"].to_numpy(), len(table)
    if not np.array_equal(np.sort(ids), np.arange(n)):
        raise ValueError(f"root: {path}: expected the node ids 0..{n - 1} once each")
    codes = pd.Categorical(table["page_type"], categories=CLASSES).codes
    if (codes < 0).any():
        unknown = sorted(set(table["page_type"][codes < 0]))
        raise ValueError(f"root: {path}: unknown page_type {unknown[:5]}; expected {CLASSES}")
    y = np.empty(n, dtype=np.int64)
    y[ids] = codes
    return torch.from_numpy(y)


def _edges(path: Path, n: int) -> torch.Tensor:
    pairs = _columns(path, ["id_1", "id_2"], dtype=np.int64).to_numpy()
    if pairs.size and (pairs.min() < 0 or pairs.max() >= n):
        raise ValueError(f"root: {path}: node ids must lie in [0, {n}), found "
                         f"[{pairs.min()}, {pairs.max()}]")
    return torch.from_numpy(np.ascontiguousarray(pairs.T))


def _features(path: Path, n: int) -> torch.Tensor:
    """The dense binary feature matrix of ``{"node id": [feature ids]}``, ``n`` rows wide as
    the largest feature id + 1 (4,714 for the release)."""
    with path.open(encoding="utf-8") as f:
        bags = json.load(f)
    if not isinstance(bags, dict) or not all(isinstance(v, list) for v in bags.values()):
        raise ValueError(f"root: {path}: expected a JSON object of feature-id lists")
    try:
        nodes = np.fromiter(map(int, bags), np.int64, len(bags))
        sizes = np.fromiter(map(len, bags.values()), np.int64, len(bags))
        cols = np.fromiter(itertools.chain.from_iterable(bags.values()), np.int64, sizes.sum())
    except (TypeError, ValueError) as err:
        raise ValueError(f"root: {path}: expected integer node and feature ids ({err})") from None
    if nodes.size and (nodes.min() < 0 or nodes.max() >= n):
        raise ValueError(f"root: {path}: node ids must lie in [0, {n}), found "
                         f"[{nodes.min()}, {nodes.max()}]")
    if cols.size and cols.min() < 0:
        raise ValueError(f"root: {path}: feature ids must be non-negative, found {cols.min()}")
    x = torch.zeros(n, int(cols.max()) + 1 if cols.size else 0)
    x[torch.from_numpy(np.repeat(nodes, sizes)), torch.from_numpy(cols)] = 1.0
    return x
