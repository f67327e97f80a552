"""Graph datasets: Planetoid graphs from a local root, planted-partition synthetic graphs, validation."""

from __future__ import annotations

import logging
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import torch
from torch_geometric.data import Data
from torch_geometric.utils import remove_self_loops, to_undirected

logger = logging.getLogger(__name__)

PLANETOID = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}
_SHARED_ROOT = Path(__file__).resolve().parents[2] / "shared" / "data" / "planetoid"


def default_root() -> Path:
    """Where Planetoid graphs are looked for: ``$GNNPIPE_DATA``, then ``../shared/data/planetoid``,
    then a user cache folder (PyG downloads there)."""
    env = os.environ.get("GNNPIPE_DATA")
    if env:
        return Path(env).expanduser()
    if _SHARED_ROOT.is_dir():
        return _SHARED_ROOT
    return _cache_dir()


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gnnpipe" / "planetoid"


def _writable_root(root: Path, folder: str) -> Path:
    """Return ``root`` if PyG can write ``processed/`` there, else a cache copy of ``<folder>/raw``."""
    target = root / folder
    if target.exists() and _writable(target):
        return root
    if not target.exists() and (not root.exists() or _writable(root)):
        return root  # PyG will create it and download
    cache = _cache_dir()
    raw = target / "raw"
    if raw.is_dir() and not (cache / folder / "raw").is_dir():
        logger.info("copying read-only %s into %s", raw, cache / folder / "raw")
        tmp = cache / folder / "raw.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(raw, tmp)
        tmp.rename(cache / folder / "raw")
    return cache


def _writable(path: Path) -> bool:
    """Writable by permission bits too: root passes ``os.access`` even on folders marked read-only."""
    return os.access(path, os.W_OK) and bool(path.stat().st_mode & stat.S_IWUSR)


def load(name: str, root: str | os.PathLike | None = None, normalize_features: bool = True) -> Data:
    """Load a Planetoid graph (``cora``, ``citeseer``, ``pubmed``) with its public split.

    Args:
        name: dataset name, case-insensitive.
        root: folder holding ``<Name>/raw/``; defaults to :func:`default_root`. A read-only root
            is copied into a writable cache first.
        normalize_features: row-normalise the bag-of-words features to sum to one, as the GCN
            and GCNII papers (and PyG's examples) do.

    Returns:
        A validated PyG ``Data`` with ``x``, ``y``, ``edge_index`` and the three masks.
    """
    from torch_geometric.datasets import Planetoid
    from torch_geometric.transforms import NormalizeFeatures

    key = str(name).lower()
    if key not in PLANETOID:
        raise ValueError(f"name: unknown dataset {name!r}; expected one of {sorted(PLANETOID)}")
    folder = PLANETOID[key]
    base = Path(root).expanduser() if root is not None else default_root()
    transform = NormalizeFeatures() if normalize_features else None
    dataset = Planetoid(str(_writable_root(base, folder)), folder, transform=transform)
    data = dataset[0]
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
    _check_int("num_nodes", num_nodes, 2)
    _check_int("num_classes", num_classes, 2)
    _check_int("num_features", num_features, 1)
    if not 0.0 <= homophily <= 1.0:
        raise ValueError(f"homophily: expected a share in [0, 1], got {homophily}")
    if not 0 < avg_degree < num_nodes:
        raise ValueError(f"avg_degree: expected 0 < avg_degree < num_nodes, got {avg_degree}")
    if not (0 < train_frac and 0 < val_frac and train_frac + val_frac < 1):
        raise ValueError("train_frac, val_frac: expected positive shares that sum below 1")

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


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value!r}")


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
    for name in ("train_mask", "val_mask", "test_mask"):
        mask = getattr(data, name, None)
        if not isinstance(mask, torch.Tensor) or mask.dim() != 1 or mask.size(0) != n:
            raise ValueError(f"data.{name}: expected a 1-D boolean tensor of length {n}")
        if mask.dtype != torch.bool:
            raise ValueError(f"data.{name}: expected dtype torch.bool, got {mask.dtype}")
    if not bool(data.train_mask.any()):
        raise ValueError("data.train_mask: is empty; at least one training node is needed")
    return data


def num_classes(data: Data) -> int:
    """Number of classes (max label + 1)."""
    return int(data.y.max()) + 1
