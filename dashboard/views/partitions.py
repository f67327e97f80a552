"""Partition views: part/chunk sizes, the part-to-part edge heatmap, halo rows, and a node
layout (the chunk graph above a size limit). Part and chunk ids are categorical axes."""

from __future__ import annotations

from typing import Any

import holoviews as hv
import holoviews.plotting.bokeh  # registers the bokeh options used below
import numpy as np
import pandas as pd
import scipy.sparse as sp

from dashboard.style import categorical_ticks
from gnnpipe.partition import Partitioning

__all__ = ["LAYOUT_ANCHOR", "LAYOUT_ITERATIONS", "MAX_LAYOUT_NODES", "MEASURE_COLORS",
           "PART_COLORS", "edge_matrix_plot", "halo_plot", "node_layout_plot", "node_positions",
           "part_color", "part_graph_plot", "partition_sizes_plot"]

#: Colours of parts 0, 1, ... (Tableau 20); parts beyond 20 reuse them cyclically.
PART_COLORS: tuple[str, ...] = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94",
    "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5",
)
#: Bar colour per measure of :func:`partition_sizes_plot`.
MEASURE_COLORS: dict[str, str] = {"nodes": "#4c78a8", "edges": "#f58518"}
#: Layout steps of :func:`node_positions` and the weight kept on the starting positions.
LAYOUT_ITERATIONS = 30
LAYOUT_ANCHOR = 0.3
#: Above this many nodes :func:`node_layout_plot` draws the part graph instead of the nodes.
MAX_LAYOUT_NODES = 3000


def part_color(part: int) -> str:
    """The colour of part ``part`` (cycling through :data:`PART_COLORS`)."""
    return PART_COLORS[int(part) % len(PART_COLORS)]


def _part_label(part: Partitioning) -> str:
    """``"chunk"`` for a GNNPipe chunking (``gp.chunk``), else ``"part"``."""
    return "chunk" if part.method == "chunk" else "part"


def _part_ids(part: Partitioning) -> list[str]:
    """Part ids as category labels ``"0"``, ``"1"``, ... in numeric order."""
    return [str(p) for p in range(part.num_parts)]


def _part_dim(part: Partitioning, name: str = "part", label: str | None = None) -> hv.Dimension:
    return hv.Dimension(name, label=label or _part_label(part), values=_part_ids(part))


def partition_sizes_plot(part: Partitioning) -> hv.Bars:
    """Grouped bars of nodes and edges (``edge_index`` entries into it) per part or chunk.

    Element data: kdims ``(part, measure)`` (``part`` a str label, ``measure`` in
    ``nodes``/``edges``), vdims ``count`` and ``color``; ``2 · P`` rows.
    """
    summary = part.summary()
    df = summary.melt(id_vars="part", value_vars=["nodes", "edges"],
                      var_name="measure", value_name="count")
    df["color"] = df["measure"].map(MEASURE_COLORS)
    df["part"] = df["part"].astype(str)
    label = _part_label(part)
    kdims = [_part_dim(part), hv.Dimension("measure", values=["nodes", "edges"])]
    title = (f"{part.num_parts} {label}s: balance nodes {part.node_balance:.2f}, "
             f"edges {part.edge_balance:.2f}")
    return hv.Bars(df, kdims=kdims, vdims=["count", "color"]).opts(
        color="color", tools=["hover"], title=title, ylabel="count", xlabel=label,
        yformatter="%d", responsive=True, height=300, backend="bokeh",
        **categorical_ticks(2 * part.num_parts),
    )


def edge_matrix_plot(part: Partitioning) -> hv.HeatMap:
    """Heatmap of :meth:`Partitioning.edge_matrix`: edges from part ``src`` to part ``dst``.

    Element data: kdims ``(dst_part, src_part)`` (str labels), vdim ``edges``; ``P²`` cells
    summing to ``E``. The diagonal holds intra-part edges.
    """
    df = part.edge_matrix().stack().rename("edges").reset_index()
    df[["src_part", "dst_part"]] = df[["src_part", "dst_part"]].astype(str)
    label = _part_label(part)
    kdims = [_part_dim(part, "dst_part", f"destination {label}"),
             _part_dim(part, "src_part", f"source {label}")]
    title = f"{label} → {label} edges (cut {part.edge_cut_fraction:.1%})"
    return hv.HeatMap(df, kdims=kdims, vdims=["edges"]).opts(
        cmap="Blues", colorbar=True, tools=["hover"], invert_yaxis=True, title=title,
        cformatter="%d",
        responsive=True, height=320, backend="bokeh", **categorical_ticks(part.num_parts),
    )


def halo_plot(part: Partitioning) -> hv.Bars:
    """Bars of halo rows per part: outside nodes that send an edge into it.

    Element data: kdim ``part`` (str labels), vdims ``halo_rows`` and ``color``; the title gives their
    sum ``M`` (the graph-parallel communication of docs/design.md §5 scales with it).
    """
    label = _part_label(part)
    df = pd.DataFrame({"part": _part_ids(part), "halo_rows": part.halo_rows})
    df["color"] = [part_color(p) for p in range(part.num_parts)]
    title = f"halo rows per {label} (M = {part.total_halo_rows:,})"
    return hv.Bars(df, kdims=[_part_dim(part)], vdims=["halo_rows", "color"]).opts(
        color="color", tools=["hover"], title=title, ylabel="halo rows", xlabel=label,
        yformatter="%d", responsive=True, height=300, backend="bokeh",
        **categorical_ticks(part.num_parts),
    )


def node_positions(edge_index: Any, assignment: np.ndarray, num_parts: int,
                   seed: int = 0, iterations: int = LAYOUT_ITERATIONS) -> np.ndarray:
    """Cheap deterministic 2-D positions (``n x 2``) that cluster nodes by part.

    Part centres sit on a unit circle; each node starts at its centre plus seeded jitter
    (``p0``); then ``iterations`` steps of ``p ← (1 − a) · D⁻¹A · p + a · p0`` pull
    nodes toward their neighbours (``a`` = :data:`LAYOUT_ANCHOR`), so boundary nodes drift
    between clusters. Each step is one sparse product, ``O(E)``.
    """
    n = len(assignment)
    angle = 2 * np.pi * np.asarray(assignment, dtype=float) / max(num_parts, 1)
    centres = np.column_stack([np.cos(angle), np.sin(angle)]) * (num_parts > 1)
    rng = np.random.default_rng(seed)
    spread = 0.6 * np.sin(np.pi / max(num_parts, 2)) if num_parts > 1 else 1.0
    p0 = centres + spread * rng.standard_normal((n, 2))
    ei = np.asarray(edge_index)
    adj = sp.coo_matrix((np.ones(ei.shape[1]), (ei[0], ei[1])), shape=(n, n)).tocsr()
    adj = adj + adj.T  # messages either way pull both ends together
    degree = np.asarray(adj.sum(axis=1)).ravel()
    walk = sp.diags(np.divide(1.0, degree, out=np.zeros(n), where=degree > 0)) @ adj
    isolated = degree == 0
    pos = p0.copy()
    for _ in range(iterations):
        pos = (1 - LAYOUT_ANCHOR) * (walk @ pos) + LAYOUT_ANCHOR * p0
        pos[isolated] = p0[isolated]
    return pos


def node_layout_plot(data: Any, part: Partitioning,
                     max_nodes: int = MAX_LAYOUT_NODES) -> hv.Overlay:
    """Nodes of a small graph coloured by part, with its edges as segments; above
    ``max_nodes`` nodes, the part graph (:func:`part_graph_plot`), which the title says.

    Args:
        data: PyG ``Data`` with ``edge_index`` and ``num_nodes`` (original node ids,
            the ids ``part.assignment`` is indexed by).
        part: The partitioning (or chunking) that colours the nodes.
        max_nodes: Above this many nodes the part graph is drawn instead.

    Returns:
        ``hv.Segments * hv.Points``: segments one per undirected non-loop edge (kdims
        ``x0, y0, x1, y1``), points one per node (kdims ``x, y``; vdims ``node``, ``part``,
        ``color``); positions by :func:`node_positions`.
    """
    n = int(data.num_nodes)
    if n > max_nodes:
        return part_graph_plot(part, note=f"{n:,} nodes > {max_nodes:,}: ")
    assignment = part.assignment.cpu().numpy()
    ei = data.edge_index.detach().cpu().numpy()
    pos = node_positions(ei, assignment, part.num_parts, seed=part.seed)
    nodes = pd.DataFrame({"x": pos[:, 0], "y": pos[:, 1], "node": np.arange(n),
                          "part": assignment})
    nodes["color"] = [part_color(p) for p in assignment]
    pairs = np.unique(np.sort(ei[:, ei[0] != ei[1]], axis=0), axis=1)
    segments = hv.Segments(
        (pos[pairs[0], 0], pos[pairs[0], 1], pos[pairs[1], 0], pos[pairs[1], 1]),
        kdims=["x0", "y0", "x1", "y1"],
    ).opts(color="#999999", alpha=0.15, line_width=0.5, backend="bokeh")
    label = _part_label(part)
    points = hv.Points(nodes, kdims=["x", "y"], vdims=["node", "part", "color"]).opts(
        color="color", size=4, line_color=None, tools=["hover"], backend="bokeh",
    )
    title = f"{n:,} nodes coloured by {label} ({part.num_parts} {label}s)"
    return (segments * points).opts(
        title=title, xaxis=None, yaxis=None, responsive=True, height=400, backend="bokeh",
    )


def part_graph_plot(part: Partitioning, note: str = "") -> hv.Overlay:
    """The graph of parts: one point per part on a circle (area ∝ its nodes), one segment per
    pair of parts with cut edges between them (width ∝ those edges, both directions summed).

    Returns:
        ``hv.Segments * hv.Points``: segments with vdim ``edges`` (one per connected pair),
        points with vdims ``part`` (str), ``nodes``, ``size``, ``color``; ``note`` starts the
        title, which says it is the part graph.
    """
    p = part.num_parts
    angle = 2 * np.pi * np.arange(p) / max(p, 1)
    x, y = np.cos(angle) * (p > 1), np.sin(angle) * (p > 1)
    sizes = np.asarray(part.sizes, dtype=float)
    nodes = pd.DataFrame({"x": x, "y": y, "part": _part_ids(part), "nodes": sizes.astype(int),
                          "size": 8 + 30 * np.sqrt(sizes / max(sizes.max(), 1.0)),
                          "color": [part_color(i) for i in range(p)]})
    matrix = part.edge_matrix().to_numpy()
    both = np.triu(matrix + matrix.T, k=1)
    src, dst = np.nonzero(both)
    weight = both[src, dst].astype(float)
    width = 1 + 9 * weight / max(weight.max(), 1.0) if len(weight) else weight
    segments = hv.Segments((x[src], y[src], x[dst], y[dst], weight.astype(int), width),
                           kdims=["x0", "y0", "x1", "y1"], vdims=["edges", "width"]).opts(
        color="#888888", alpha=0.5, line_width="width", tools=["hover"], backend="bokeh")
    points = hv.Points(nodes, kdims=["x", "y"], vdims=["part", "nodes", "size", "color"]).opts(
        color="color", size="size", line_color="white", tools=["hover"], backend="bokeh")
    label = _part_label(part)
    title = f"{note}{label} graph ({p} {label}s; lines: cut edges)"
    return (segments * points).opts(
        title=title, xaxis=None, yaxis=None, padding=0.15, responsive=True, height=400,
        backend="bokeh")
