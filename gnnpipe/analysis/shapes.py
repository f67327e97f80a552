"""The graph's sizes a job's memory depends on: a chunking's chunk rows, adjacency bytes,
gather space and sources outside each chunk (:class:`ChunkedShape`), and each graph-parallel
rank's rows, halo rows and edges (:class:`PartShape`)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch_geometric.data import Data

from gnnpipe.core.job import TrainConfig
from gnnpipe.core.kinds import Mode, TrainSchedule
from gnnpipe.engine.graph import Adjacency, chunk_rows, normalized_adjacency
from gnnpipe.nn import LayerStack
from gnnpipe.partition import Partitioning

__all__ = ["ChunkedShape", "PartShape", "adjacency_bytes", "tensor_bytes"]


def tensor_bytes(tensors: Sequence[Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views of one storage count once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def _csr_parts(m: Tensor) -> list[Tensor]:
    return [m.crow_indices(), m.col_indices(), m.values()]


def adjacency_bytes(adj: Adjacency, bounds: list[int] | None) -> int:
    """``Â`` and ``Âᵀ``, and with ``bounds`` the chunks' row blocks built from them (the views
    cost nothing, the compacted column indices do)."""
    tensors = _csr_parts(adj.A) + _csr_parts(adj.AT)
    if bounds is not None:
        for rows in chunk_rows(adj, bounds):
            for block in (rows.A, rows.AT):
                tensors += _csr_parts(block.csr) + ([block.cols] if block.cols is not None else [])
    return tensor_bytes(tensors)


def _gather_bytes(adj: Adjacency, bounds: list[int], widths: Sequence[int]) -> int:
    """The gather space of a CPU stage: per width its products read, as tall as the most
    columns a chunk's rows of ``Â`` or ``Âᵀ`` read."""
    if adj.A.device.type != "cpu" or not widths:
        return 0
    tallest = max(int(b.cols.numel()) if b.cols is not None else adj.num_nodes
                  for rows in chunk_rows(adj, bounds) for b in (rows.A, rows.AT))
    return tallest * sum(set(widths)) * 4


@dataclass(frozen=True)
class PartShape:
    """One graph-parallel rank's share of the graph: its rows, its halo rows (the distinct
    columns of its rows' edges outside them) and its edges."""

    rows: int
    halo: int
    nnz: int

    @classmethod
    def all_of(cls, model: LayerStack, data: Data, parts: Partitioning) -> list[PartShape]:
        ordered = parts.apply(data)
        full = normalized_adjacency(ordered.edge_index, ordered.num_nodes, model.norm)
        out = []
        for lo, hi in itertools.pairwise(parts.bounds.tolist()):
            cols = full.rows(lo, hi).A.col_indices()
            halo = int(torch.unique(cols[(cols < lo) | (cols >= hi)]).numel())
            out.append(cls(hi - lo, halo, int(cols.numel())))
        return out


def _sources_outside(edge_index: Tensor, bounds: list[int]) -> list[int]:
    """Per chunk, the distinct sources outside it of the edges into it: the rows a chunk's
    message-passing layers read besides its own (and push gradients to)."""
    src, dst = edge_index
    return [int(torch.unique(src[(dst >= lo) & (dst < hi) & ((src < lo) | (src >= hi))]).numel())
            for lo, hi in itertools.pairwise(bounds)]


@dataclass(frozen=True)
class ChunkedShape:
    """A chunking of the graph, as a chunked job's memory depends on it."""

    nodes: int
    edges: int
    sizes: list[int]  # rows of each chunk, largest first
    adjacency: int  # bytes of Â, Âᵀ and the chunks' row blocks
    gather: int  # bytes of a stage's gather space
    features: int  # bytes of the reordered graph a one-process run keeps
    sources: list[int]  # per chunk, its distinct sources outside it (0s without message passing)

    @classmethod
    def of(cls, model: LayerStack, data: Data, chunking: Partitioning,
           passing: bool) -> ChunkedShape:
        ordered = chunking.apply(data)
        bounds = chunking.bounds.tolist()
        sizes = [b - a for a, b in itertools.pairwise(bounds)]
        adj = normalized_adjacency(ordered.edge_index, data.num_nodes, model.norm)
        return cls(
            nodes=data.num_nodes, edges=ordered.edge_index.size(1),
            sizes=sorted(sizes, reverse=True), adjacency=adjacency_bytes(adj, bounds),
            gather=_gather_bytes(adj, bounds, [b.out_dim for b in model.blocks if b.aggregates]),
            features=tensor_bytes([ordered.x, ordered.y, ordered.edge_index, ordered.train_mask,
                                    ordered.val_mask, ordered.test_mask]),
            sources=_sources_outside(ordered.edge_index, bounds) if passing else [0] * len(sizes))

    def rows_trained(self, ways: int) -> int:
        """Rows a rank trains per epoch (its way's chunks, at most)."""
        return sum(self.sizes[:math.ceil(len(self.sizes) / ways)]) if ways > 1 else self.nodes

    def slot_rows(self, job: TrainConfig, stage: int) -> int:
        """Rows of a 1F1B stage's recompute cache: a slot as tall as the tallest chunk per
        chunk in flight (``S - s`` on a pipeline rank, one in one process)."""
        in_flight = 1 if job.mode is Mode.LOCAL else job.stages - stage
        return self.sizes[0] * in_flight

    def stashed(self, job: TrainConfig, stage: int) -> int:
        """Rows whose tensors a stage keeps at once until their backward: every chunk of its
        epoch (fill-drain), the ``S - s`` largest chunks (1F1B on a pipeline rank) or the largest
        (1F1B in one process, where each chunk's backward follows its forward)."""
        if job.schedule is TrainSchedule.GNNPIPE:
            return self.rows_trained(job.ways)
        in_flight = 1 if job.mode is Mode.LOCAL else job.stages - stage
        return sum(self.sizes[:in_flight])
