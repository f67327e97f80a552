"""Graph datasets: Planetoid graphs, Facebook and Squirrel (from the data root, or downloaded
from their public sources: :mod:`gnnpipe.datasets.sources`), planted-partition synthetic graphs, a user's own graph made ready to train (:func:`prepare_data`), validation."""

from __future__ import annotations

import copy
import logging
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Data
from torch_geometric.utils import remove_self_loops, to_undirected

from gnnpipe.core import checks as check
from gnnpipe.datasets.safe_pickle import load_planetoid_pickle
from gnnpipe.datasets.sources import SOURCES, cache_root, data_root, fetch, missing_files

__all__ = ["NAMES", "PLANETOID", "default_root", "load", "num_classes", "prepare_data",
           "single_graph", "synthetic", "validate"]

logger = logging.getLogger(__name__)

PLANETOID = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}
#: Graphs read from their files under the data root (not Planetoid's layout).
LOCAL = ("facebook", "squirrel")
NAMES = (*PLANETOID, *LOCAL)

def default_root(name: str = "cora") -> Path:
    """The root ``load(name)`` reads: the data root (``$GNNPIPE_DATA``, else the user cache,
    :func:`gnnpipe.datasets.sources.data_root`) for ``facebook`` and ``squirrel``, its
    ``planetoid/`` folder for Planetoid graphs (which hold ``<Name>/raw/`` there)."""
    root = data_root()
    return root / "planetoid" if str(name).lower() in PLANETOID else root


def _cache_root(key: str) -> Path:
    return cache_root() / "planetoid" if key in PLANETOID else cache_root()


def _locate(key: str, root: Path | None) -> Path:
    """The folder holding ``key``'s files: under ``root`` (or the data root, then the user
    cache), downloaded from the dataset's source if no candidate has them all: into the first
    candidate when it can be written, else into the cache. Nothing is written next to a folder
    that has the files."""
    sub = SOURCES[key].folder
    firsts = [root] if root is not None else [default_root(key)]
    candidates = list(dict.fromkeys([firsts[0] / sub, _cache_root(key) / sub]))
    for folder in candidates:
        if not missing_files(folder, SOURCES[key]):
            return folder
    existing = next(p for p in (candidates[0], *candidates[0].parents) if p.exists())
    target = candidates[0] if _writable(existing) else candidates[-1]
    logger.info("%s: not found in %s; downloading into %s", key,
                " or ".join(map(str, candidates)), target)
    return fetch(key, target)


def _read_matrix(path: Path) -> torch.Tensor:
    """A Planetoid feature or one-hot label matrix, as float (dense), read without running code."""
    obj = load_planetoid_pickle(path)
    arr = np.asarray(obj.todense() if hasattr(obj, "todense") else obj)
    if arr.ndim != 2 or arr.dtype.kind not in "biuf":
        raise ValueError(f"root: {path} is not a Planetoid file: expected a 2-D numeric matrix, "
                         f"got {type(obj).__name__} of shape {arr.shape}, dtype {arr.dtype}")
    return torch.from_numpy(arr).to(torch.float)


def _read_planetoid(raw: Path, key: str) -> Data:
    """The graph with its public split, built exactly as PyG's ``read_planetoid_data`` does, from
    files read by :func:`gnnpipe.datasets.safe_pickle.load_planetoid_pickle` (PyG's reader unpickles them
    with ``pickle`` and caches with ``torch.load``, either of which runs code from a crafted file)."""
    from torch_geometric.io import read_txt_array
    from torch_geometric.io.planetoid import edge_index_from_dict
    from torch_geometric.utils import index_to_mask

    # ``x`` (the labelled rows of ``allx``) is unused, but checked like the others, as PyG does.
    _x, tx, allx, y, ty, ally = (_read_matrix(raw / f"ind.{key}.{n}")
                                    for n in ("x", "tx", "allx", "y", "ty", "ally"))
    graph = load_planetoid_pickle(raw / f"ind.{key}.graph")
    if not isinstance(graph, dict):  # a bad file, not a bad argument: ValueError like the rest
        raise ValueError(  # noqa: TRY004
            f"root: {raw / f'ind.{key}.graph'} is not a Planetoid file: expected a dict of "
            f"adjacency lists, got {type(graph).__name__}")
    test_index = read_txt_array(str(raw / f"ind.{key}.test.index"), dtype=torch.long)
    sorted_test = test_index.sort()[0]
    if key == "citeseer":  # isolated test nodes: zero rows of tx, ty at the missing indices
        span, low = int(test_index.max() - test_index.min()) + 1, test_index.min()
        tx_ext, ty_ext = torch.zeros(span, tx.size(1)), torch.zeros(span, ty.size(1))
        tx_ext[sorted_test - low], ty_ext[sorted_test - low] = tx, ty
        tx, ty = tx_ext, ty_ext
    features = torch.cat([allx, tx], dim=0)
    features[test_index] = features[sorted_test]
    labels = torch.cat([ally, ty], dim=0).max(dim=1)[1]
    labels[test_index] = labels[sorted_test]
    n, n_train = labels.size(0), y.size(0)
    data = Data(x=features, edge_index=edge_index_from_dict(graph, num_nodes=n), y=labels)
    data.train_mask = index_to_mask(torch.arange(n_train), size=n)
    data.val_mask = index_to_mask(torch.arange(n_train, n_train + 500), size=n)
    data.test_mask = index_to_mask(test_index, size=n)
    return data


def _writable(path: Path) -> bool:
    """Writable by permission bits too: root passes ``os.access`` even on folders marked read-only."""
    return os.access(path, os.W_OK) and bool(path.stat().st_mode & stat.S_IWUSR)


def load(name: str, root: str | os.PathLike | None = None, normalize_features: bool | None = None,
         seed: int = 0, split: int = 0) -> Data:
    """Load a Planetoid graph (``cora``, ``citeseer``, ``pubmed``) with its public split, the
    Facebook Page-Page graph (``facebook``) with a seeded split, or the Squirrel Wikipedia graph
    (``squirrel``) with one of its ten published splits.

    ``facebook`` (MUSAE): 22,470 pages, 170,823 undirected mutual-like edges (the release's
    171,002 less its 179 self-loops), 4,714 binary features (row-normalised like Cora's), 4
    classes ``y`` in the order of :data:`gnnpipe.datasets.facebook.CLASSES` (company, government,
    politician, tvshow). It has no official split: as Planetoid's, 20 training nodes per class
    (80), then 500 validation and 1,000 test nodes, drawn from one permutation seeded by ``seed``.

    ``squirrel`` (Platonov et al., ICLR 2023; the GNNPipe paper's graph): 5,201 pages, 198,353
    undirected edges (both directions, no self-loops), 2,089 features, 5 classes, dense and
    heterophilous; ``split`` picks one of its ten splits (0: 2,496 / 1,664 / 1,041, the
    paper's).

    Args:
        name: dataset name, case-insensitive.
        root: Planetoid: folder holding ``<Name>/raw/``; ``facebook``: folder holding
            ``musae-facebook/``; ``squirrel``: folder holding ``heterophilous/squirrel.npz``;
            defaults to :func:`default_root`. Files missing there (and in the user cache) are
            downloaded from the dataset's public source, sizes checked
            (:mod:`gnnpipe.datasets.sources`). Planetoid's raw files are read with a restricted
            unpickler (a file naming any other global is refused, none of it run) and nothing
            is cached: PyG's ``processed/`` is neither read nor written. Facebook's are plain
            csv and json; Squirrel's npz is read with ``allow_pickle=False``.
        normalize_features: row-normalise the features to sum to one, as the GCN and GCNII
            papers (and PyG's examples) do for bag-of-words graphs (default: ``True``, except
            for ``squirrel``, whose features are kept as released: row-normalised, a GCNII-16
            does not train there, test accuracy 0.31 against 0.40, ``benchmarks/squirrel.py``).
        seed: seeds Facebook's split; Planetoid graphs have a fixed public split (seed 0 only).
        split: Squirrel's published split, 0-9 (default: 0); other graphs have one (0 only).

    Returns:
        A validated PyG ``Data`` with ``x``, ``y``, ``edge_index`` and the three masks.
    """
    from torch_geometric.transforms import NormalizeFeatures

    key = str(name).lower()
    if key not in NAMES:
        raise ValueError(f"name: unknown dataset {name!r}; expected one of {sorted(NAMES)}")
    check.integer("seed", seed, 0)
    check.integer("split", split, 0)
    if split and key != "squirrel":
        raise ValueError(f"split: {key} has one split, so split must be 0, got {split}")
    if seed and key not in ("facebook", "squirrel"):
        raise ValueError(f"seed: {key} has a fixed public split, so seed must be 0, got {seed}")
    if seed and key == "squirrel":
        raise ValueError(f"seed: squirrel's splits are published (choose one with split=), so "
                         f"seed must be 0, got {seed}")
    folder = _locate(key, Path(root).expanduser() if root is not None else None)
    if key == "facebook":
        from gnnpipe.datasets.facebook import read_facebook

        data = read_facebook(folder.parent, seed)
    elif key == "squirrel":
        from gnnpipe.datasets.squirrel import read_squirrel

        data = read_squirrel(folder.parent, split)
    else:
        data = _read_planetoid(folder, key)
    if normalize_features is None:
        normalize_features = key != "squirrel"
    if normalize_features:
        data = NormalizeFeatures()(data)
    data.name = key
    validate(data)
    return data


def synthetic(
    num_nodes: int = 10_000,
    avg_degree: float = 10.0,
    num_classes: int = 8,
    num_features: int = 64,
    homophily: float = 0.8,
    seed: int = 0,
    feature_signal: float = 0.5,
    train_frac: float = 0.1,
    val_frac: float = 0.2,
) -> Data:
    """A planted-partition graph whose labels are learnable from features and structure.

    Every node gets a class; each undirected edge joins a random node to a node of the same class
    with probability ``homophily`` (else to a node of another class), so ``homophily`` is the share
    of edges inside a class. Features are a class centre scaled by ``feature_signal`` plus unit
    Gaussian noise, so features alone are only partly informative and aggregation helps.
    Deterministic per ``seed``; a million nodes take seconds.
    """
    _check_synthetic(num_nodes, avg_degree, num_classes, num_features, homophily, seed,
                     feature_signal, train_frac, val_frac)

    rng = np.random.default_rng(seed)
    n, k = int(num_nodes), int(num_classes)
    y = rng.integers(0, k, size=n)
    by_class = np.argsort(y, kind="stable")
    counts = np.bincount(y, minlength=k)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])

    m = round(n * avg_degree / 2)
    src = rng.integers(0, n, size=m)
    same = rng.random(m) < homophily
    shift = rng.integers(1, k, size=m)
    dst_class = np.where(same, y[src], (y[src] + shift) % k)
    pick = (rng.random(m) * counts[dst_class]).astype(np.int64)
    dst = by_class[offsets[dst_class] + pick]

    edge_index = torch.from_numpy(np.stack([src, dst])).long()
    edge_index, _ = remove_self_loops(edge_index)
    edge_index = to_undirected(edge_index, num_nodes=n)  # symmetrizes and coalesces

    centres = rng.standard_normal((k, num_features)).astype(np.float32)
    x = feature_signal * centres[y] + rng.standard_normal((n, num_features), dtype=np.float32)

    order = rng.permutation(n)
    n_train, n_val = int(train_frac * n), int(val_frac * n)
    masks = [torch.zeros(n, dtype=torch.bool) for _ in range(3)]
    masks[0][torch.from_numpy(order[:n_train])] = True
    masks[1][torch.from_numpy(order[n_train:n_train + n_val])] = True
    masks[2][torch.from_numpy(order[n_train + n_val:])] = True

    data = Data(x=torch.from_numpy(x), y=torch.from_numpy(y).long(), edge_index=edge_index,
                train_mask=masks[0], val_mask=masks[1], test_mask=masks[2], num_nodes=n)
    data.name = f"synthetic-{n}"
    return data


def _check_synthetic(num_nodes: object, avg_degree: object, num_classes: object,
                     num_features: object, homophily: object, seed: object,
                     feature_signal: object, train_frac: object, val_frac: object) -> None:
    n = check.integer("num_nodes", num_nodes, 3)
    check.integer("num_classes", num_classes, 2)
    check.integer("num_features", num_features, 1)
    check.integer("seed", seed, 0)
    check.share("homophily", homophily)
    check.finite_float("feature_signal", feature_signal)
    degree = check.positive_float("avg_degree", avg_degree)
    if degree >= n:
        raise ValueError(f"avg_degree: expected 0 < avg_degree < num_nodes ({n}), got {avg_degree}")
    train, val = check.positive_float("train_frac", train_frac), check.positive_float(
        "val_frac", val_frac)
    if train + val >= 1:
        raise ValueError("train_frac, val_frac: expected positive shares that sum below 1, got "
                         f"{train_frac} and {val_frac}")
    if int(train * n) < 1 or int(val * n) < 1 or n - int(train * n) - int(val * n) < 1:
        raise ValueError(f"num_nodes: {n} nodes leave a split empty at train_frac={train_frac}, "
                         f"val_frac={val_frac}; use more nodes or larger shares")


_NO_SPLIT = (
    "data: the graph has no {missing}; pass split= to gp.train (or gp.datasets.prepare_data): "
    "{{'train': ids, 'valid': ids, 'test': ids}} (node ids, as OGB's split_idx), 'random' (a "
    "seeded 60/20/20 split) or shares such as {{'train': 0.6, 'val': 0.2, 'test': 0.2}}")


def single_graph(data: Any) -> Data:
    """``data``, or the one graph of a PyG ``Dataset`` (whole-graph training takes one graph)."""
    from torch_geometric.data import Dataset

    if isinstance(data, Dataset):
        if len(data) != 1:
            raise ValueError(f"data: expected a Dataset of one graph (whole-graph training takes "
                             f"one), got {len(data)} graphs; pass dataset[i]")
        data = data[0]
    if not isinstance(data, Data):
        raise TypeError(f"data: expected a torch_geometric.data.Data or a Dataset of one graph, "
                        f"got {type(data).__name__}")
    return data


def prepare_data(data: Any, split: Any = None, seed: int = 0) -> Data:
    """Your own graph, ready to train: what ``gp.train`` and ``gp.plan`` do to ``data`` first.

    A PyG ``Dataset`` gives its one graph (an OGB dataset's ``get_idx_split()`` is its split
    when ``split`` is not given and the graph has no masks). OGB-style ``[n, 1]`` labels are
    flattened. ``split`` (see :func:`gnnpipe.datasets.splits.masks_from_split`: node ids,
    ``"random"`` or shares, seeded by ``seed``) replaces the graph's masks; without it, the
    graph's masks are kept, else a ``split_idx`` dict stored on it is used, else a ValueError
    says what to pass. The result may share tensors with ``data``, which is never modified;
    check it with :func:`validate`.
    """
    from gnnpipe.datasets.splits import MASKS, masks_from_split

    graph = single_graph(data)
    missing = [m for m in MASKS if getattr(graph, m, None) is None]
    if split is None and missing:
        split = getattr(graph, "split_idx", None)
        if split is None and hasattr(data, "get_idx_split"):
            split = data.get_idx_split()
        if split is None:
            raise ValueError(_NO_SPLIT.format(missing="/".join(missing)))
    flat = isinstance(graph.y, torch.Tensor) and graph.y.dim() == 2 and graph.y.size(1) == 1
    if split is None and not flat:
        return graph
    out = copy.copy(graph)  # a shallow copy: new attributes do not reach the caller's graph
    if flat:
        out.y = graph.y.view(-1)
    if split is not None:
        for name, mask in masks_from_split(split, out.num_nodes, seed).items():
            out[name] = mask
        if "split_idx" in out:
            del out.split_idx
    return out


def validate(data: Data) -> Data:
    """Check a graph for the mistakes that would silently corrupt training; return it unchanged.

    Raises:
        ValueError: naming the field and what was expected.
    """
    if not isinstance(data, Data):
        raise TypeError(f"data: expected a torch_geometric.data.Data, got {type(data).__name__}")
    x = getattr(data, "x", None)
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError("data.x: expected a 2-D float tensor of node features")
    if not x.is_floating_point():
        raise ValueError(f"data.x: expected a floating-point dtype, got {x.dtype}")
    n = x.size(0)
    if data.num_nodes is not None and data.num_nodes != n:
        raise ValueError(f"data.num_nodes is {data.num_nodes} but data.x has {n} rows")
    if not torch.isfinite(x).all():
        raise ValueError("data.x: contains NaN or inf values")
    ei = getattr(data, "edge_index", None)
    if not isinstance(ei, torch.Tensor) or ei.dim() != 2 or ei.size(0) != 2:
        raise ValueError("data.edge_index: expected a tensor of shape [2, num_edges]")
    if ei.dtype != torch.long:
        raise ValueError(f"data.edge_index: expected dtype torch.long, got {ei.dtype}")
    if ei.numel() and (int(ei.min()) < 0 or int(ei.max()) >= n):
        raise ValueError(
            f"data.edge_index: node ids must lie in [0, {n}), found "
            f"[{int(ei.min())}, {int(ei.max())}]")
    y = getattr(data, "y", None)
    if not isinstance(y, torch.Tensor) or y.dim() != 1 or y.size(0) != n:
        raise ValueError(f"data.y: expected a 1-D label tensor of length {n}")
    if y.dtype != torch.long:
        raise ValueError(f"data.y: expected dtype torch.long, got {y.dtype}")
    if y.numel() and int(y.min()) < 0:
        raise ValueError("data.y: labels must be non-negative class ids")
    _check_masks(data, n)
    return data


def _check_masks(data: Data, n: int) -> None:
    """Three boolean masks of length ``n``, none empty, validation and test nodes not trained on."""
    for name in ("train_mask", "val_mask", "test_mask"):
        mask = getattr(data, name, None)
        if not isinstance(mask, torch.Tensor) or mask.dim() != 1 or mask.size(0) != n:
            raise ValueError(f"data.{name}: expected a 1-D boolean tensor of length {n}")
        if mask.dtype != torch.bool:
            raise ValueError(f"data.{name}: expected dtype torch.bool, got {mask.dtype}")
    if not bool(data.train_mask.any()):
        raise ValueError("data.train_mask: is empty; at least one training node is needed")
    for name in ("val_mask", "test_mask"):
        mask = getattr(data, name)
        if not bool(mask.any()):
            raise ValueError(f"data.{name}: is empty; expected at least one node (accuracy and "
                             "the best epoch are measured on it)")
        if shared := int((mask & data.train_mask).sum()):
            raise ValueError(f"data.{name}: expected no training nodes, got {shared} nodes that "
                             "are also in data.train_mask")


def num_classes(data: Data) -> int:
    """Number of classes (max label + 1)."""
    return int(data.y.max()) + 1
