"""Predicted communication bytes per epoch for each mode (the formulas of docs/design.md §5)."""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Data

from gnnpipe.core.kinds import Precision
from gnnpipe.datasets import single_graph
from gnnpipe.engine.local import stage_ranges
from gnnpipe.engine.probe import AggregationCall, probe_calls
from gnnpipe.nn import LayerStack
from gnnpipe.partition import Partitioning, chunk, partition
from gnnpipe.pyg import as_stack

__all__ = ["BYTES_PER_VALUE", "MODES", "boundary_row_totals", "comm_volume", "exchange_bytes",
           "graph_bytes", "hybrid_boundary_bytes", "pipeline_bytes"]

BYTES_PER_VALUE = 4  # fp32

MODES = ("single", "local", "pipeline", "graph", "hybrid")


def pipeline_bytes(model: LayerStack, num_nodes: int, ranges: list[tuple[int, int]],
                   wire: Precision = Precision.FLOAT32) -> int:
    """Every row of every tensor crossing a stage boundary, forward and backward:
    ``2 · (S−1) · n · d · 4`` for uniform width ``d`` (GCNII's ``h0`` doubles it), 2 bytes a
    value instead of 4 on a 16-bit ``wire``."""
    widths = sum(sum(model.boundary_widths(start)) for start, _ in ranges[1:])
    return 2 * num_nodes * widths * wire.itemsize


def _calls(model: LayerStack) -> list[AggregationCall]:
    """Every aggregation call of the stack, in order."""
    return [c for block in probe_calls(model.blocks, model.blocks[0].in_dim) for c in block]


def graph_bytes(model: LayerStack, halo_rows: int, wire: Precision = Precision.FLOAT32) -> int:
    """Halo rows at every aggregation, forward (rows) and backward (their gradients, where the
    aggregation's input needs one): ``2 · L · d · M · 4`` for uniform width ``d`` (2 bytes a
    value on a 16-bit ``wire``)."""
    values = sum(c.width * (2 if c.needs_grad else 1) for c in _calls(model))
    return halo_rows * values * wire.itemsize


def _pushed_rows(edge_index: Tensor, bounds: list[int]) -> int:
    """Rows a message-passing layer's backward pushes to, summed over chunks: for each chunk,
    the distinct sources outside it of edges into it."""
    src, dst = edge_index
    total = 0
    for lo, hi in itertools.pairwise(bounds):
        outside = src[(dst >= lo) & (dst < hi) & ((src < lo) | (src >= hi))]
        total += int(torch.unique(outside).numel())
    return total


def boundary_row_totals(model: LayerStack, data: Data, chunking: Partitioning) -> tuple[int, int, int]:
    """Summed over chunks: the rows of each chunk that other chunks read (forward), the rows
    whose ``dZ`` other chunks pull (backward), and the rows a message-passing layer's backward
    pushes to (each chunk's distinct sources outside it; 0 without message passing)."""
    from gnnpipe.engine.buffers import boundary_rows
    from gnnpipe.engine.graph import normalized_adjacency

    ordered = chunking.apply(data)
    bounds = chunking.bounds.tolist()
    adj = normalized_adjacency(ordered.edge_index, ordered.num_nodes, model.norm)
    forward, backward = (sum(int(t.numel()) for t in side) for side in boundary_rows(adj, bounds))
    pushed = _pushed_rows(ordered.edge_index, bounds) if any(
        c.message_passing and c.needs_grad for c in _calls(model)) else 0
    return forward, backward, pushed


def exchange_bytes(calls: list[AggregationCall], totals: tuple[int, int, int], ways: int,
                   history: Precision = Precision.FLOAT32) -> int:
    """What ``calls`` send the other ``W - 1`` ways per epoch, over all chunk steps, given
    :func:`boundary_row_totals`: ``Hbuf`` and ``dZbuf`` rows as the history stores them,
    pushes in float32."""
    forward, backward, pushed = totals
    stored = sum(c.width * (forward + (backward if c.needs_grad and not c.message_passing else 0))
                 for c in calls)
    pushes = sum(c.width * pushed for c in calls if c.needs_grad and c.message_passing)
    return (ways - 1) * (stored * history.itemsize + pushes * BYTES_PER_VALUE)


def hybrid_boundary_bytes(model: LayerStack, data: Data, chunking: Partitioning, ways: int,
                          history: Precision = Precision.FLOAT32) -> int:
    """Boundary rows every chunk step sends to the other ``W − 1`` ways at every aggregation:
    forward the rows other chunks read; backward their gradients (``dZ`` rows of ``Â @ h``) or,
    for a message-passing call, the gradients it pushes to other chunks' rows. ``Hbuf`` and
    ``dZbuf`` rows go as the history stores them (``history``); pushes in float32."""
    return exchange_bytes(_calls(model), boundary_row_totals(model, data, chunking), ways,
                          history)


def comm_volume(model: LayerStack, data: Data, mode: str, stages: int = 1, parts: int = 1,
                ways: int = 1, partitioning: Partitioning | None = None, seed: int = 0,
                chunks: int | None = None, ranges: list[tuple[int, int]] | None = None,
                history_dtype: Any = "float32", wire_dtype: Any = "float32") -> int:
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
        history_dtype: ``hybrid``: what the historical buffers are stored in (``gp.train``'s
            ``history_dtype``): the ways exchange their rows in it. (default: float32)
        wire_dtype: what boundary activations and gradients and halo rows are sent in
            (``gp.train``'s ``wire_dtype``). (default: float32)

    ``hybrid`` is ``pipeline`` traffic plus, at every aggregation of every chunk step, each
    chunk's boundary rows (forward) and their gradients (backward) sent to the other ways.
    """
    if mode not in MODES:
        raise ValueError(f"mode: unknown mode {mode!r}; expected one of {MODES}")
    history = Precision.of("history_dtype", history_dtype)
    wire = Precision.of("wire_dtype", wire_dtype)
    model = as_stack(model, data)  # a PyG BasicGNN / Sequential
    data = single_graph(data)
    if mode in ("single", "local"):
        return 0
    ranges = [(a, b) for a, b in ranges] if ranges else stage_ranges(model, stages)
    if mode == "pipeline":
        return pipeline_bytes(model, data.num_nodes, ranges, wire)
    if mode == "hybrid":
        if partitioning is None:
            partitioning = chunk(data, chunks or 4 * stages * ways, seed=seed)
        return (pipeline_bytes(model, data.num_nodes, ranges, wire)
                + hybrid_boundary_bytes(model, data, partitioning, ways, history))
    if partitioning is None:
        partitioning = partition(data, parts, method="metis", seed=seed)
    elif partitioning.num_parts != parts:
        raise ValueError(f"partitioning: has {partitioning.num_parts} parts but the mode needs {parts}")
    return graph_bytes(model, int(partitioning.total_halo_rows), wire)
