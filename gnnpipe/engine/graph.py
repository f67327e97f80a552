"""Normalised adjacency as CSR (and its transpose), row slices per chunk, and sparse-dense matmul."""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["Adjacency", "ChunkRows", "GatherSpace", "RowBlock", "SpMM", "chunk_rows", "coo_to_csr",
           "csr_mm", "normalized_adjacency"]

warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")


_INT32_MAX = 2**31 - 1


def coo_to_csr(row: Tensor, col: Tensor, val: Tensor, shape: tuple[int, int]) -> Tensor:
    """CSR of the entries ``(row, col, val)``, with 32-bit indices where they fit: the sparse
    kernels (MKL on the CPU) take 32-bit indices and would copy 64-bit ones on every product."""
    order = torch.argsort(row * shape[1] + col)
    row, col, val = row[order], col[order], val[order]
    crow = torch.zeros(shape[0] + 1, dtype=torch.long)
    crow[1:] = torch.cumsum(torch.bincount(row, minlength=shape[0]), 0)
    if max(shape[1], col.numel()) <= _INT32_MAX:
        crow, col = crow.int(), col.int()
    return torch.sparse_csr_tensor(crow, col, val, shape)


@dataclass(frozen=True)
class Adjacency:
    """``Â`` (messages flow source -> target, row = target) and ``Âᵀ``, both CSR; ``edge_index``
    is the graph's own ``[2, E]`` edges (for PyG message-passing layers), on full-graph
    adjacencies only."""

    A: Tensor
    AT: Tensor
    edge_index: Tensor | None = None

    @property
    def num_nodes(self) -> int:
        return self.A.size(0)

    @property
    def nnz(self) -> int:
        return int(self.A.col_indices().numel())

    def to(self, device: torch.device | str) -> Adjacency:
        """Both matrices on ``device``."""
        edges = None if self.edge_index is None else self.edge_index.to(device)
        return Adjacency(self.A.to(device), self.AT.to(device), edges)

    def rows(self, lo: int, hi: int) -> Adjacency:
        """Rows ``lo:hi`` of ``Â`` and of ``Âᵀ`` (cheap views of the CSR arrays)."""
        return Adjacency(_row_slice(self.A, lo, hi), _row_slice(self.AT, lo, hi))


#: A graph-wide sparse product is computed in row blocks of at most this many bytes of result
#: (:func:`csr_mm`).
PRODUCT_BLOCK_BYTES = 1 << 21


class GatherSpace:
    """Reusable buffers, one per (width, dtype, device), for :class:`RowBlock`'s gathered
    operand: a stage runs its products one at a time, so one buffer as tall as the largest
    gather serves them all (at a million nodes a fresh one per product would be tens of MB
    mapped and faulted in each time)."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[int, torch.dtype, torch.device], Tensor] = {}

    def take(self, rows: int, width: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        """``rows × width`` of ``dtype`` on ``device`` (the buffer grows to the largest asked
        for)."""
        key = (width, dtype, device)
        buf = self._buffers.get(key)
        if buf is None or buf.size(0) < rows:
            buf = self._buffers[key] = torch.empty((rows, width), dtype=dtype, device=device)
        return buf[:rows]


@dataclass(frozen=True)
class RowBlock:
    """Rows of a CSR matrix for products with a full-graph dense operand.

    When the rows read only some columns, ``csr``'s columns are renumbered to those (``cols``,
    ascending) and ``block @ dense`` first gathers ``dense[cols]`` in address order into
    ``space``, then multiplies the compact block, which stays in cache. A chunk reads a third
    of a 50K-node graph's rows, scattered over buffers last touched 31 layers ago: on the CPU
    the plain product waits on memory for each of them and takes twice as long. The sums and
    their order are the plain product's (the results are bitwise equal)."""

    csr: Tensor
    cols: Tensor | None = None
    space: GatherSpace | None = None

    def __matmul__(self, dense: Tensor) -> Tensor:
        """``csr @ dense`` in ``csr``'s dtype: a ``dense`` stored in fewer bits (a compact
        history) is read back as that dtype, row by gathered row."""
        dtype = self.csr.dtype
        if self.cols is None:
            return self.csr @ dense.to(dtype)
        if self.space is None:
            return self.csr @ dense.index_select(0, self.cols).to(dtype)
        gathered = self.space.take(self.cols.numel(), dense.size(1), dtype, dense.device)
        if dense.dtype == dtype:
            return self.csr @ torch.index_select(dense, 0, self.cols, out=gathered)
        return self.csr @ gathered.copy_(dense.index_select(0, self.cols))

    @classmethod
    def compact(cls, rows: Tensor, space: GatherSpace | None = None) -> RowBlock:
        """``rows`` (CSR) with its columns renumbered to the ones it reads, unless it reads all."""
        cols, renumbered = torch.unique(rows.col_indices(), return_inverse=True)
        if cols.numel() == rows.size(1):
            return cls(rows)
        index = renumbered.to(rows.col_indices().dtype)
        csr = torch.sparse_csr_tensor(rows.crow_indices(), index, rows.values(),
                                      (rows.size(0), cols.numel()))
        return cls(csr, cols.long(), space)


@dataclass(frozen=True)
class ChunkRows:
    """A chunk's rows of ``Â`` (forward) and ``Âᵀ`` (backward), as :class:`RowBlock`s."""

    A: RowBlock
    AT: RowBlock

    @classmethod
    def of(cls, adj: Adjacency, lo: int, hi: int, space: GatherSpace | None) -> ChunkRows:
        """Rows ``lo:hi`` of ``adj``; compacted for gathering when ``space`` is given."""
        rows = adj.rows(lo, hi)
        if space is None:
            return cls(RowBlock(rows.A), RowBlock(rows.AT))
        return cls(RowBlock.compact(rows.A, space), RowBlock.compact(rows.AT, space))


def chunk_rows(adj: Adjacency, bounds: Sequence[int]) -> list[ChunkRows]:
    """Every chunk's rows (chunk ``c`` is rows ``bounds[c]:bounds[c+1]``): on the CPU compacted
    to gather through one shared :class:`GatherSpace`, plain on other devices (a gather there is
    one more launch in an epoch that is launch-bound)."""
    space = GatherSpace() if adj.A.device.type == "cpu" else None
    return [ChunkRows.of(adj, int(lo), int(hi), space) for lo, hi in itertools.pairwise(bounds)]


def _row_slice(m: Tensor, lo: int, hi: int) -> Tensor:
    crow = m.crow_indices()
    a, b = int(crow[lo]), int(crow[hi])
    return torch.sparse_csr_tensor(crow[lo:hi + 1] - a, m.col_indices()[a:b], m.values()[a:b],
                                   (hi - lo, m.size(1)))


def normalized_adjacency(edge_index: Tensor, num_nodes: int, norm: str) -> Adjacency:
    """Build ``Â`` once per graph.

    Args:
        edge_index: ``[2, E]`` source/target pairs (both directions for undirected graphs).
        num_nodes: ``n``.
        norm: ``"sym"`` — ``D^-1/2 (A + I) D^-1/2`` (GCN, GCNII); ``"mean"`` — row-normalised
            ``D^-1 A`` without self-loops (GraphSAGE, ResGCN+).

    Built on the CPU; returned on ``edge_index``'s device.
    """
    device = edge_index.device
    src, dst = edge_index[0].cpu(), edge_index[1].cpu()
    keep = src != dst
    src, dst = src[keep], dst[keep]
    if norm == "sym":
        loops = torch.arange(num_nodes)
        src, dst = torch.cat([src, loops]), torch.cat([dst, loops])
        deg = torch.bincount(dst, minlength=num_nodes).float()
        inv_sqrt = deg.pow(-0.5)
        val = inv_sqrt[dst] * inv_sqrt[src]
    elif norm == "mean":
        deg = torch.bincount(dst, minlength=num_nodes).float().clamp(min=1.0)
        val = 1.0 / deg[dst]
    else:
        raise ValueError(f"norm: expected 'sym' or 'mean', got {norm!r}")
    shape = (num_nodes, num_nodes)
    return Adjacency(coo_to_csr(dst, src, val, shape), coo_to_csr(src, dst, val, shape),
                     edge_index.cpu()).to(device)


def csr_mm(csr: Tensor, dense: Tensor) -> Tensor:
    """``csr @ dense``, bitwise equal, in row blocks of at most :data:`PRODUCT_BLOCK_BYTES` of
    result: torch's CSR product holds a second result-sized buffer while it runs (2.0× the
    result at 100,000 rows, measured), a whole graph's worth in every full-graph aggregation
    that the memory model does not see; row blocks hold one block more (1.1×). On the CPU only:
    on a GPU each block's row offsets would wait on the device."""
    n, width = csr.size(0), dense.size(1)
    rows = max(1, PRODUCT_BLOCK_BYTES // max(width * dense.element_size(), 1))
    if n <= rows or csr.device.type != "cpu":
        return csr @ dense
    out = dense.new_empty((n, width))
    for lo in range(0, n, rows):
        hi = min(lo + rows, n)
        out[lo:hi] = _row_slice(csr, lo, hi) @ dense
    return out


class SpMM(torch.autograd.Function):
    """``Â @ h`` with backward ``Âᵀ @ grad`` (exact full-graph aggregation)."""

    @staticmethod
    def forward(ctx: Any, h: Tensor, adj: Adjacency) -> Tensor:
        ctx.adj = adj
        return csr_mm(adj.A, h)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return csr_mm(ctx.adj.AT, grad), None
