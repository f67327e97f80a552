"""Predicted communication bytes per epoch for each mode (the formulas of DESIGN.md §4)."""

from __future__ import annotations

from torch_geometric.data import Data

from gnnpipe.datasets import single_graph
from gnnpipe.engine.local import stage_ranges
from gnnpipe.models import LayerStack
from gnnpipe.partition import Partitioning, chunk, partition
from gnnpipe.pyg import as_stack

BYTES_PER_VALUE = 4  # fp32

MODES = ("single", "local", "pipeline", "graph", "hybrid")


def pipeline_bytes(model: LayerStack, num_nodes: int, ranges: list[tuple[int, int]]) -> int:
    """Every row of every tensor crossing a stage boundary, forward and backward:
    ``2 · (S−1) · n · d · 4`` for uniform width ``d`` (GCNII's ``h0`` doubles it)."""
    widths = sum(sum(model.boundary_widths(start)) for start, _ in ranges[1:])
    return 2 * num_nodes * widths * BYTES_PER_VALUE


def graph_bytes(model: LayerStack, halo_rows: int) -> int:
    """Halo rows at every aggregation, forward (rows) and backward (their gradients):
    ``2 · L · d · M · 4`` for uniform width ``d``; PyG layers exchange their input width
    (:attr:`gnnpipe.pyg.PyGBlock.halo_width`)."""
    widths = sum(getattr(b, "halo_width", 2 * b.out_dim) for b in model.blocks if b.aggregates)
    return halo_rows * widths * BYTES_PER_VALUE


def hybrid_boundary_bytes(model: LayerStack, data: Data, chunking: Partitioning, ways: int) -> int:
    """Boundary rows every chunk step sends to the other ``W − 1`` ways, forward (rows) and
    backward (their gradients), at every aggregation."""
    from gnnpipe.engine.chunked import boundary_rows
    from gnnpipe.engine.graph import normalized_adjacency

    ordered = chunking.apply(data)
    adj = normalized_adjacency(ordered.edge_index, ordered.num_nodes, model.norm)
    forward, backward = boundary_rows(adj, chunking.bounds.tolist())
    rows = sum(int(t.numel()) for t in forward) + sum(int(t.numel()) for t in backward)
    widths = sum(b.out_dim for b in model.blocks if b.aggregates)
    return (ways - 1) * rows * widths * BYTES_PER_VALUE


def comm_volume(model: LayerStack, data: Data, mode: str, stages: int = 1, parts: int = 1,
                ways: int = 1, partitioning: Partitioning | None = None, seed: int = 0,
                chunks: int | None = None, ranges: list[tuple[int, int]] | None = None) -> int:
    """Bytes sent per epoch by ``mode``, excluding the weight-gradient all-reduce.

    Args:
        model: the stack.
        data: the graph, or a PyG ``Dataset`` of one (only its size and, for
            ``graph``/``hybrid``, its edges are used).
        mode: one of :data:`MODES`; one-process modes send nothing.
        stages: pipeline stages (``pipeline``, ``hybrid``), split as the runtime splits them.
        parts: graph-parallel ranks (``graph``).
        ways: data-parallel ways of ``hybrid``.
        partitioning: ``graph``: the METIS partitioning giving the halo rows ``M``; ``hybrid``:
            the chunking (``gp.chunk``). Computed when absent.
        seed: seeds METIS when the partitioning is computed here.
        chunks: ``hybrid``'s chunk count (default ``4 · stages · ways``).
        ranges: the stages' block ranges (a planned split); default: as even as possible.

    ``hybrid`` is ``pipeline`` traffic plus, at every aggregation of every chunk step, each
    chunk's boundary rows (forward) and their gradients (backward) sent to the other ways.
    """
    if mode not in MODES:
        raise ValueError(f"mode: unknown mode {mode!r}; expected one of {MODES}")
    model = as_stack(model, data)  # a PyG BasicGNN / Sequential
    data = single_graph(data)
    if mode in ("single", "local"):
        return 0
    ranges = [tuple(r) for r in ranges] if ranges else stage_ranges(len(model), stages)
    if mode == "pipeline":
        return pipeline_bytes(model, data.num_nodes, ranges)
    if mode == "hybrid":
        if partitioning is None:
            partitioning = chunk(data, chunks or 4 * stages * ways, seed=seed)
        return (pipeline_bytes(model, data.num_nodes, ranges)
                + hybrid_boundary_bytes(model, data, partitioning, ways))
    if partitioning is None:
        partitioning = partition(data, parts, method="metis", seed=seed)
    elif partitioning.num_parts != parts:
        raise ValueError(f"partitioning: has {partitioning.num_parts} parts but the mode needs {parts}")
    return graph_bytes(model, int(partitioning.total_halo_rows))
