"""Predicted communication bytes per epoch for each mode (the formulas of DESIGN.md §4)."""

from __future__ import annotations

from torch_geometric.data import Data

from gnnpipe.engine.local import stage_ranges
from gnnpipe.models import LayerStack
from gnnpipe.partition import Partitioning, partition

BYTES_PER_VALUE = 4  # fp32

MODES = ("single", "local", "pipeline", "graph", "hybrid")


def pipeline_bytes(model: LayerStack, num_nodes: int, ranges: list[tuple[int, int]]) -> int:
    """Every row of every tensor crossing a stage boundary, forward and backward:
    ``2 · (S−1) · n · d · 4`` for uniform width ``d`` (GCNII's ``h0`` doubles it)."""
    widths = sum(sum(model.boundary_widths(start)) for start, _ in ranges[1:])
    return 2 * num_nodes * widths * BYTES_PER_VALUE


def graph_bytes(model: LayerStack, halo_rows: int) -> int:
    """Halo rows at every aggregation, forward (rows) and backward (their gradients):
    ``2 · L · d · M · 4`` for uniform width ``d``."""
    widths = sum(b.out_dim for b in model.blocks if b.aggregates)
    return 2 * halo_rows * widths * BYTES_PER_VALUE


def comm_volume(model: LayerStack, data: Data, mode: str, stages: int = 1, parts: int = 1,
                ways: int = 1, partitioning: Partitioning | None = None, seed: int = 0) -> int:
    """Bytes sent per epoch by ``mode``, excluding the weight-gradient all-reduce.

    Args:
        model: the stack.
        data: the graph (only its size and, for ``graph``/``hybrid``, its edges are used).
        mode: one of :data:`MODES`; one-process modes send nothing.
        stages: pipeline stages (``pipeline``, ``hybrid``), split as the runtime splits them.
        parts: graph-parallel ranks (``graph``).
        ways: data-parallel ways of ``hybrid``.
        partitioning: a METIS partitioning to take the halo rows ``M`` from; computed when absent.
        seed: seeds METIS when the partitioning is computed here.

    ``hybrid`` is ``pipeline`` traffic plus, at every aggregation, the halo rows between ways
    (``graph`` traffic with ``P = W``).
    """
    if mode not in MODES:
        raise ValueError(f"mode: unknown mode {mode!r}; expected one of {MODES}")
    if mode in ("single", "local"):
        return 0
    if mode == "pipeline":
        return pipeline_bytes(model, data.num_nodes, stage_ranges(len(model), stages))
    ranks = parts if mode == "graph" else ways
    if partitioning is None:
        partitioning = partition(data, ranks, method="metis", seed=seed)
    elif partitioning.num_parts != ranks:
        raise ValueError(f"partitioning: has {partitioning.num_parts} parts but the mode needs {ranks}")
    halo = graph_bytes(model, int(partitioning.total_halo_rows))
    if mode == "graph":
        return halo
    return halo + pipeline_bytes(model, data.num_nodes, stage_ranges(len(model), stages))
