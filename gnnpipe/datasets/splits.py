"""Train/val/test masks from a ``split``: OGB-style node ids, seeded random shares, or
Planetoid-style stratified counts."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from gnnpipe.core import checks as check

__all__ = ["MASKS", "RANDOM_SHARES", "masks_from_split", "stratified_masks"]

MASKS = ("train_mask", "val_mask", "test_mask")
#: ``split="random"``: shares of the nodes in train, val and test.
RANDOM_SHARES = {"train": 0.6, "val": 0.2, "test": 0.2}
_KEYS = {"train": "train", "val": "val", "valid": "val", "test": "test"}  # OGB says "valid"


def masks_from_split(split: Any, num_nodes: int, seed: Any = 0) -> dict[str, torch.Tensor]:
    """The three masks ``split`` describes, by mask name (``train_mask``, ...).

    Args:
        split: ``"random"`` (:data:`RANDOM_SHARES`), a dict of shares ``{"train": 0.6,
            "val": 0.2, "test": 0.2}`` (seeded, disjoint, summing to at most 1), or a dict of
            node ids ``{"train": idx, "valid": idx, "test": idx}`` (OGB's ``split_idx``: tensors,
            arrays or lists of ids, or boolean masks). ``"val"`` and ``"valid"`` are synonyms.
        num_nodes: the graph's node count.
        seed: seeds the random splits.
    """
    if isinstance(split, str):
        if split != "random":
            raise ValueError(f"split: expected 'random' or a dict with keys 'train', 'valid' and "
                             f"'test', got {split!r}")
        split = RANDOM_SHARES
    if not isinstance(split, Mapping):
        raise TypeError(f"split: expected 'random' or a dict with keys 'train', 'valid' and "
                        f"'test', got {type(split).__name__}")
    parts = _named_parts(split)
    if all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in parts.values()):
        return _random_masks(num_nodes, parts, seed)
    return {f"{k}_mask": _index_mask(f"split[{k!r}]", v, num_nodes) for k, v in parts.items()}


def _named_parts(split: Mapping) -> dict[str, Any]:
    """``split``'s values under ``train``, ``val`` and ``test`` (``valid`` read as ``val``)."""
    parts = {_KEYS.get(k, k): v for k, v in split.items()}
    if len(parts) != len(split) or set(parts) != {"train", "val", "test"}:
        raise ValueError(f"split: expected the keys 'train', 'valid' (or 'val') and 'test', "
                         f"got {sorted(map(str, split))}")
    return parts


def _index_mask(name: str, ids: Any, num_nodes: int) -> torch.Tensor:
    """A boolean mask of ``num_nodes`` from node ids (tensor, array, list) or a boolean mask."""
    arr = ids.detach().cpu().numpy() if torch.is_tensor(ids) else np.asarray(ids)
    if arr.size == 0:
        raise ValueError(f"{name}: is empty; expected at least one node id")
    if arr.dtype.kind not in "biu":
        raise TypeError(f"{name}: expected integer node ids or a boolean mask, got dtype "
                        f"{arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D list of node ids, got shape {arr.shape}")
    t = torch.from_numpy(arr.astype(bool if arr.dtype.kind == "b" else np.int64))  # a copy
    if t.dtype == torch.bool:
        if t.size(0) != num_nodes:
            raise ValueError(f"{name}: expected a boolean mask of length {num_nodes}, "
                             f"got length {t.size(0)}")
        return t
    low, high = int(t.min()), int(t.max())
    if low < 0 or high >= num_nodes:
        raise ValueError(f"{name}: node ids must lie in [0, {num_nodes}), found [{low}, {high}]")
    return _mask(t, num_nodes)


def _random_masks(num_nodes: int, shares: Mapping[str, Any], seed: Any) -> dict[str, torch.Tensor]:
    """Disjoint masks of ``floor(share · n)`` nodes each, from one seeded permutation (train
    first, then val, then test); shares summing below 1 leave the other nodes out."""
    check.integer("seed", seed, 0)
    sizes = [math.floor(check.positive_float(f"split[{k!r}]", shares[k]) * num_nodes)
             for k in ("train", "val", "test")]
    if sum(float(shares[k]) for k in ("train", "val", "test")) > 1 + 1e-9:
        raise ValueError(f"split: expected shares summing to at most 1, got {dict(shares)}")
    if min(sizes) < 1:
        raise ValueError(f"split: shares {dict(shares)} of {num_nodes} nodes leave a split empty")
    order = torch.from_numpy(np.random.default_rng(seed).permutation(num_nodes))
    bounds = np.cumsum([0, *sizes])
    return {name: _mask(order[bounds[i]:bounds[i + 1]], num_nodes) for i, name in enumerate(MASKS)}


def stratified_masks(y: torch.Tensor, per_class: int, num_val: int, num_test: int,
                     seed: int) -> dict[str, torch.Tensor]:
    """Planetoid's recipe, seeded: ``per_class`` training nodes of every class, then ``num_val``
    validation and ``num_test`` test nodes from the rest, all taken in the order of one
    permutation from ``numpy.random.default_rng(seed)``."""
    order = torch.from_numpy(np.random.default_rng(seed).permutation(y.numel()))
    labels = y[order]
    train = torch.cat([order[labels == c][:per_class] for c in range(int(y.max()) + 1)])
    rest = order[~_mask(train, y.numel())[order]]
    return {"train_mask": _mask(train, y.numel()),
            "val_mask": _mask(rest[:num_val], y.numel()),
            "test_mask": _mask(rest[num_val:num_val + num_test], y.numel())}


def _mask(ids: torch.Tensor, n: int) -> torch.Tensor:
    mask = torch.zeros(n, dtype=torch.bool)
    mask[ids] = True
    return mask
