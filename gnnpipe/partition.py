"""Graph partitions (METIS / random / contiguous), GNNPipe chunking, and their quality metrics."""

from __future__ import annotations

import copy
import operator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd
import torch

from gnnpipe.core.checks import positive_int
from gnnpipe.core.job import PARTS_PER_CHUNK

__all__ = ["METHODS", "Partitioning", "chunk", "partition"]

#: Valid values of ``partition(method=...)``.
METHODS: tuple[str, ...] = ("metis", "random", "contiguous")
#: Constant part of the METIS node weight ``50 + degree`` (balances nodes and edges).
NODE_WEIGHT_BASE = 50


@dataclass(frozen=True, eq=False)
class Partitioning:
    """A node -> part assignment, the node order that makes each part contiguous, and metrics.

    Node ids are the graph's original ids unless said otherwise. Edges are the entries of
    ``edge_index`` (``edge_index[0]`` = source, ``edge_index[1]`` = destination, messages
    flow source -> destination as in PyG). Metrics are computed lazily, vectorized, and
    cached; per-part metrics are numpy ``int64`` arrays of length ``num_parts``.

    Attributes:
        assignment: ``LongTensor[n]``, original node id -> part (or chunk) id.
        num_parts: Number of parts ``P`` (chunks ``C`` for :func:`chunk`).
        perm: ``LongTensor[n]``, new position -> original node id.
        inv_perm: ``LongTensor[n]``, original node id -> new position.
        bounds: ``LongTensor[P + 1]``; part ``p`` is rows ``bounds[p]:bounds[p + 1]`` of the
            permuted order.
        method: ``"metis"``, ``"random"``, ``"contiguous"`` or ``"chunk"``.
        edge_index: The graph's ``2 x E`` edge index (kept for the metrics).
        seed: Seed the partition was made with.
    """

    assignment: torch.Tensor
    num_parts: int
    perm: torch.Tensor
    inv_perm: torch.Tensor
    bounds: torch.Tensor
    method: str
    edge_index: torch.Tensor = field(repr=False)
    seed: int = 0

    @classmethod
    def from_assignment(
        cls,
        assignment: np.ndarray | torch.Tensor,
        num_parts: int,
        edge_index: torch.Tensor,
        method: str,
        seed: int = 0,
        order: np.ndarray | None = None,
    ) -> Partitioning:
        """Build a Partitioning, laying parts out contiguously in part-id order.

        Args:
            assignment: Part id per node, in ``[0, num_parts)``.
            num_parts: Number of parts.
            edge_index: The graph's ``2 x E`` edge index.
            method: Name recorded in ``method``.
            seed: Seed recorded in ``seed``.
            order: Optional secondary sort key per node (order within a part); nodes with
                equal keys keep their original relative order.
        """
        part = torch.as_tensor(assignment).cpu().numpy().astype(np.int64, copy=False)
        n = part.shape[0]
        if order is None:
            perm = np.argsort(part, kind="stable")
        else:  # lexsort is stable: by part, then order, then original id
            perm = np.lexsort((np.asarray(order), part))
        inv_perm = np.empty(n, dtype=np.int64)
        inv_perm[perm] = np.arange(n, dtype=np.int64)
        bounds = np.zeros(num_parts + 1, dtype=np.int64)
        np.cumsum(np.bincount(part, minlength=num_parts), out=bounds[1:])
        return cls(
            assignment=torch.from_numpy(part.copy()),
            num_parts=int(num_parts),
            perm=torch.from_numpy(perm.astype(np.int64, copy=False)),
            inv_perm=torch.from_numpy(inv_perm),
            bounds=torch.from_numpy(bounds),
            method=method,
            seed=seed,
            edge_index=edge_index,
        )

    @property
    def num_nodes(self) -> int:
        """Number of nodes ``n``."""
        return int(self.assignment.numel())

    # ----------------------------------------------------------------- metrics (lazy)
    @cached_property
    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(part, src, dst)`` as numpy arrays."""
        ei = self.edge_index.detach().cpu()
        return self.assignment.numpy(), ei[0].numpy(), ei[1].numpy()

    @cached_property
    def _edge_matrix(self) -> np.ndarray:
        part, src, dst = self._arrays
        p = self.num_parts
        counts = np.bincount(part[src] * p + part[dst], minlength=p * p)
        return counts.reshape(p, p)

    @cached_property
    def _cut_counts(self) -> tuple[int, int]:
        """``(edge_cut, undirected_edges)``, both over distinct unordered non-loop pairs."""
        part, src, dst = self._arrays
        n = self.num_nodes
        keep = src != dst
        lo, hi = np.minimum(src[keep], dst[keep]), np.maximum(src[keep], dst[keep])
        pairs = _distinct(lo * n + hi)
        cut = int(np.count_nonzero(part[pairs // n] != part[pairs % n]))
        return cut, int(pairs.size)

    @cached_property
    def edge_cut(self) -> int:
        """Number of **undirected** edges crossing parts.

        Counts distinct unordered node pairs ``{u, v}`` (``u != v``) joined by an edge in
        either direction whose endpoints lie in different parts. For a symmetric
        ``edge_index`` without duplicates this is the number of crossing entries / 2.
        """
        return self._cut_counts[0]

    @cached_property
    def edge_cut_fraction(self) -> float:
        """``edge_cut`` / number of distinct undirected non-loop edges (0.0 without edges)."""
        cut, total = self._cut_counts
        return cut / total if total else 0.0

    @cached_property
    def halo_rows(self) -> np.ndarray:
        """Per part: distinct nodes outside it that send an edge into it.

        These are the remote rows a part needs for one aggregation (the in-neighbours of
        its nodes that it does not own); for symmetric graphs, simply its outside
        neighbours. Their sum is ``M`` of docs/design.md §5.
        """
        part, src, dst = self._arrays
        cross = part[src] != part[dst]
        keys = _distinct(part[dst[cross]] * self.num_nodes + src[cross])
        return np.bincount(keys // self.num_nodes, minlength=self.num_parts)

    @cached_property
    def total_halo_rows(self) -> int:
        """``M``: halo rows summed over all parts."""
        return int(self.halo_rows.sum())

    @cached_property
    def sizes(self) -> np.ndarray:
        """Nodes per part."""
        return np.diff(self.bounds.numpy())

    @cached_property
    def edge_counts(self) -> np.ndarray:
        """Per part: ``edge_index`` entries whose destination lies in it (self-loops too)."""
        return self._edge_matrix.sum(axis=0)

    @cached_property
    def node_balance(self) -> float:
        """Largest part size / mean part size (1.0 is perfect)."""
        return _balance(self.sizes)

    @cached_property
    def edge_balance(self) -> float:
        """Largest ``edge_counts`` / mean ``edge_counts`` (1.0 is perfect, or no edges)."""
        return _balance(self.edge_counts)

    def edge_matrix(self) -> pd.DataFrame:
        """``P x P`` counts of ``edge_index`` entries from part ``i`` (row) to part ``j``.

        The diagonal holds intra-part edges; the whole table sums to ``E``.
        """
        parts = pd.RangeIndex(self.num_parts)
        return pd.DataFrame(
            self._edge_matrix.copy(),
            index=parts.rename("src_part"),
            columns=parts.rename("dst_part"),
        )

    def summary(self) -> pd.DataFrame:
        """One row per part: ``part``, ``nodes``, ``edges`` (into it), ``halo_rows``."""
        return pd.DataFrame(
            {
                "part": np.arange(self.num_parts),
                "nodes": self.sizes,
                "edges": self.edge_counts,
                "halo_rows": self.halo_rows,
            }
        )

    def apply(self, data: Any) -> Any:
        """Return a copy of ``data`` with nodes renumbered to the partition order.

        Node-level tensors (``x``, ``y``, masks, ...) are reordered by ``perm`` and
        ``edge_index`` is remapped through ``inv_perm``; edge order and edge attributes are
        unchanged. Part ``p`` of the result is nodes ``bounds[p]:bounds[p + 1]``.

        Args:
            data: A ``torch_geometric.data.Data`` with the same nodes as this partitioning.
        """
        if data.num_nodes != self.num_nodes:
            raise ValueError(
                f"data: has {data.num_nodes} nodes, but the partitioning has {self.num_nodes}"
            )
        out = copy.copy(data)
        for key, value in data.items():
            if not torch.is_tensor(value):
                continue
            if key == "edge_index":
                out[key] = self.inv_perm.to(value.device)[value]
            elif data.is_node_attr(key):
                out[key] = value[self.perm.to(value.device)]
        return out

    def __repr__(self) -> str:
        return (
            f"Partitioning(method={self.method!r}, num_parts={self.num_parts}, "
            f"num_nodes={self.num_nodes}, edge_cut={self.edge_cut} "
            f"({self.edge_cut_fraction:.1%}), total_halo_rows={self.total_halo_rows}, "
            f"node_balance={self.node_balance:.3f}, edge_balance={self.edge_balance:.3f})"
        )


# ------------------------------------------------------------------------- public API
def partition(data: Any, num_parts: int, method: str = "metis", seed: int = 0) -> Partitioning:
    """Split a graph's nodes into ``num_parts`` parts.

    Args:
        data: PyG ``Data`` with ``edge_index`` (``2 x E``) and ``num_nodes``.
        num_parts: Number of parts, ``1 <= num_parts <= num_nodes``.
        method: ``"metis"`` (pymetis, node weight ``50 + degree``, minimizes edge cut),
            ``"random"`` (seeded permutation split into equal parts) or ``"contiguous"``
            (node id ranges).
        seed: Seed for METIS and for ``"random"``.

    Returns:
        A :class:`Partitioning`; parts are laid out contiguously in part-id order.

    Raises:
        ValueError: On an unknown ``method``, a ``num_parts`` outside ``[1, num_nodes]``,
            or a malformed ``data``.
    """
    if method not in METHODS:
        raise ValueError(f"method: expected one of {', '.join(METHODS)}; got {method!r}")
    n, edge_index = _validate_graph(data)
    num_parts = _count_arg("num_parts", num_parts, n)
    seed = _count_arg("seed", seed, None)
    if num_parts == 1:
        part = np.zeros(n, dtype=np.int64)
    elif method == "metis":
        part = _fill_empty(_metis(edge_index, n, num_parts, seed), num_parts)
    elif method == "random":
        part = np.empty(n, dtype=np.int64)
        part[np.random.default_rng(seed).permutation(n)] = _even_split(n, num_parts)
    else:
        part = _even_split(n, num_parts)
    return Partitioning.from_assignment(part, num_parts, edge_index, method, seed)


def chunk(data: Any, num_chunks: int, seed: int = 0,
          parts_per_chunk: int = PARTS_PER_CHUNK) -> Partitioning:
    """Chunk a graph for GNNPipe training (docs/design.md §5).

    METIS splits the graph into ``min(parts_per_chunk * num_chunks, num_nodes)`` parts, which
    are shuffled (seeded) and merged into ``num_chunks`` chunks of (about) ``parts_per_chunk``
    parts each. Nodes are then ordered by chunk, by part within a chunk, and by original id, so
    each chunk is a contiguous range of the new order. ``num_chunks=1`` is the identity order.

    With ``parts_per_chunk=1`` (the default) the chunks are METIS's own parts: the fewest edges
    between chunks, so the fewest historical rows read and the least of other chunks' rows each
    chunk's aggregation touches. ``parts_per_chunk=4`` is the GNNPipe paper's random merge.

    Args:
        data: PyG ``Data`` with ``edge_index`` (``2 x E``) and ``num_nodes``.
        num_chunks: Number of chunks ``C``, ``1 <= C <= num_nodes``.
        seed: Seed for METIS and for the random merge.
        parts_per_chunk: METIS parts merged into each chunk (at least 1).

    Returns:
        A :class:`Partitioning` with ``method="chunk"`` whose parts are the chunks.

    Raises:
        ValueError: On a ``num_chunks`` outside ``[1, num_nodes]`` or a malformed ``data``.
    """
    n, edge_index = _validate_graph(data)
    num_chunks = _count_arg("num_chunks", num_chunks, n)
    seed = _count_arg("seed", seed, None)
    parts_per_chunk = positive_int("parts_per_chunk", parts_per_chunk)
    if num_chunks == 1:
        return Partitioning.from_assignment(
            np.zeros(n, dtype=np.int64), 1, edge_index, "chunk", seed
        )
    num_sub = min(parts_per_chunk * num_chunks, n)
    sub = _metis(edge_index, n, num_sub, seed)
    # Position of each METIS part in a seeded shuffle; consecutive positions form a chunk.
    position = np.empty(num_sub, dtype=np.int64)
    position[np.random.default_rng(seed).permutation(num_sub)] = np.arange(num_sub)
    node_pos = position[sub]
    part = _fill_empty(_even_split(num_sub, num_chunks)[node_pos], num_chunks)
    return Partitioning.from_assignment(
        part, num_chunks, edge_index, "chunk", seed, order=node_pos
    )


# ---------------------------------------------------------------------------- helpers
def _validate_graph(data: Any) -> tuple[int, torch.Tensor]:
    """Return ``(num_nodes, edge_index)`` after checking both."""
    edge_index = getattr(data, "edge_index", None)
    n = getattr(data, "num_nodes", None)
    if not torch.is_tensor(edge_index):
        raise ValueError("data: expected a torch_geometric Data with an edge_index tensor")
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"data.edge_index: expected shape (2, E); got {tuple(edge_index.shape)}")
    if edge_index.dtype.is_floating_point or edge_index.dtype == torch.bool:
        raise ValueError(f"data.edge_index: expected an integer tensor; got {edge_index.dtype}")
    if n is None or int(n) < 1:
        raise ValueError(f"data.num_nodes: expected a positive node count; got {n}")
    n = int(n)
    if edge_index.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= n):
        raise ValueError(f"data.edge_index: node ids must lie in [0, {n}) (num_nodes)")
    return n, edge_index.long()


def _count_arg(name: str, value: Any, upper: int | None) -> int:
    """Check an integer argument: positive and ``<= upper``, or (``upper=None``) ``>= 0``."""
    try:
        if isinstance(value, bool):
            raise TypeError
        value = operator.index(value)
    except TypeError:
        raise ValueError(f"{name}: expected an int; got {value!r}") from None
    if upper is None:
        if value < 0:
            raise ValueError(f"{name}: expected a non-negative int; got {value}")
    elif not 1 <= value <= upper:
        raise ValueError(f"{name}: expected 1 <= {name} <= num_nodes ({upper}); got {value}")
    return value


def _distinct(keys: np.ndarray) -> np.ndarray:
    """Sorted distinct values (``np.sort`` + diff; much faster than ``np.unique`` here)."""
    if keys.size == 0:
        return keys
    keys = np.sort(keys)
    keep = np.empty(keys.size, dtype=bool)
    keep[0] = True
    np.not_equal(keys[1:], keys[:-1], out=keep[1:])
    return keys[keep]


def _csr(edge_index: torch.Tensor, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric CSR ``(xadj, adjncy)`` without self-loops or duplicate edges, int64."""
    ei = edge_index.detach().cpu().numpy()
    src, dst = ei[0], ei[1]
    keep = src != dst
    src, dst = src[keep], dst[keep]
    keys = _distinct(np.concatenate([src * n + dst, dst * n + src]))
    rows = keys // n
    xadj = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=xadj[1:])
    return xadj, keys - rows * n


def _metis(edge_index: torch.Tensor, n: int, num_parts: int, seed: int) -> np.ndarray:
    """METIS part per node, node weight ``50 + degree``, deterministic for a seed."""
    import pymetis

    xadj, adjncy = _csr(edge_index, n)
    vweights = NODE_WEIGHT_BASE + np.diff(xadj)
    options = pymetis.Options(seed=int(seed))
    if hasattr(pymetis, "CSRAdjacency"):  # pymetis >= 2025.2; xadj/adjncy is deprecated
        graph: dict[str, Any] = {"adjacency": pymetis.CSRAdjacency(xadj, adjncy)}
    else:
        graph = {"xadj": xadj, "adjncy": adjncy}
    result = pymetis.part_graph(num_parts, **graph, vweights=vweights, options=options)
    return np.asarray(result[1], dtype=np.int64)


def _even_split(n: int, num_parts: int) -> np.ndarray:
    """``[0, 0, ..., P-1]`` of length ``n``: ``P`` ranges whose sizes differ by at most 1."""
    return np.arange(n, dtype=np.int64) * num_parts // n


def _fill_empty(part: np.ndarray, num_parts: int) -> np.ndarray:
    """Give each empty part one node taken from the currently largest part."""
    sizes = np.bincount(part, minlength=num_parts)
    for empty in np.flatnonzero(sizes == 0):  # rare: METIS on tiny or disconnected graphs
        donor = int(np.argmax(sizes))
        node = np.flatnonzero(part == donor)[-1]
        part[node] = empty
        sizes[donor] -= 1
        sizes[empty] += 1
    return part


def _balance(values: np.ndarray) -> float:
    """``max / mean`` of ``values`` (1.0 when all are zero)."""
    mean = float(np.mean(values))
    return float(np.max(values)) / mean if mean > 0 else 1.0
