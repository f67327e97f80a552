"""Partition views: part/chunk sizes, the part-to-part edge heatmap, halo rows, node layout."""

from __future__ import annotations

from typing import Any

import holoviews as hv
import holoviews.plotting.bokeh  # registers the bokeh options used below
import numpy as np
import pandas as pd
import scipy.sparse as sp

from gnnpipe.partition import Partitioning

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


def part_color(part: int) -> str:
    """The colour of part ``part`` (cycling through :data:`PART_COLORS`)."""
    return PART_COLORS[int(part) % len(PART_COLORS)]


def part_label(part: Partitioning) -> str:
    """``"chunk"`` for a GNNPipe chunking (``gp.chunk``), else ``"part"``."""
    return "chunk" if part.method == "chunk" else "part"


def partition_sizes_plot(part: Partitioning) -> hv.Bars:
    """Grouped bars of nodes and edges (``edge_index`` entries into it) per part or chunk.

    Element data: kdims ``(part, measure)`` with ``measure`` in ``nodes``/``edges``, vdims
    ``count`` and ``color``; ``2 · P`` rows.
    """
    summary = part.summary()
    df = summary.melt(id_vars="part", value_vars=["nodes", "edges"],
                      var_name="measure", value_name="count")
    df["color"] = df["measure"].map(MEASURE_COLORS)
    label = part_label(part)
    kdims = [hv.Dimension("part", label=label), hv.Dimension("measure")]
    title = (f"{part.num_parts} {label}s: node balance {part.node_balance:.2f}, "
             f"edge balance {part.edge_balance:.2f}")
    return hv.Bars(df, kdims=kdims, vdims=["count", "color"]).opts(
        color="color", tools=["hover"], title=title, ylabel="count", xlabel=label,
        responsive=True, height=300, backend="bokeh",
    )


def edge_matrix_plot(part: Partitioning) -> hv.HeatMap:
    """Heatmap of :meth:`Partitioning.edge_matrix`: edges from part ``src`` to part ``dst``.

    Element data: kdims ``(dst_part, src_part)``, vdim ``edges``; ``P²`` cells summing to
    ``E``. The diagonal holds intra-part edges.
    """
    df = part.edge_matrix().stack().rename("edges").reset_index()
    label = part_label(part)
    kdims = [hv.Dimension("dst_part", label=f"destination {label}"),
             hv.Dimension("src_part", label=f"source {label}")]
    title = f"{label}-to-{label} edges (cut {part.edge_cut_fraction:.1%})"
    return hv.HeatMap(df, kdims=kdims, vdims=["edges"]).opts(
        cmap="Blues", colorbar=True, tools=["hover"], invert_yaxis=True, title=title,
        responsive=True, height=320, backend="bokeh",
    )


def halo_plot(part: Partitioning) -> hv.Bars:
    """Bars of halo rows per part: outside nodes that send an edge into it.

    Element data: kdim ``part``, vdims ``halo_rows`` and ``color``; the title gives their
    sum ``M`` (the graph-parallel communication of DESIGN.md §4 scales with it).
    """
    label = part_label(part)
    df = pd.DataFrame({"part": np.arange(part.num_parts), "halo_rows": part.halo_rows})
    df["color"] = [part_color(p) for p in df["part"]]
    title = f"halo rows per {label} (M = {part.total_halo_rows})"
    return hv.Bars(df, kdims=[hv.Dimension("part", label=label)],
                   vdims=["halo_rows", "color"]).opts(
        color="color", tools=["hover"], title=title, ylabel="halo rows", xlabel=label,
        responsive=True, height=300, backend="bokeh",
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
                     max_nodes: int = 3000) -> hv.Overlay | hv.Div:
    """Nodes of a small graph coloured by part, with its edges as segments.

    Args:
        data: PyG ``Data`` with ``edge_index`` and ``num_nodes`` (original node ids,
            the ids ``part.assignment`` is indexed by).
        part: The partitioning (or chunking) that colours the nodes.
        max_nodes: Above this many nodes the layout is skipped.

    Returns:
        ``hv.Segments * hv.Points``: segments one per undirected non-loop edge (kdims
        ``x0, y0, x1, y1``), points one per node (kdims ``x, y``; vdims ``node``, ``part``,
        ``color``); positions by :func:`node_positions`. Above ``max_nodes`` an ``hv.Div``
        saying the layout is skipped.
    """
    n = int(data.num_nodes)
    if n > max_nodes:
        return hv.Div(f"<p>Node layout skipped: {n} nodes is above max_nodes={max_nodes}.</p>")
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
    label = part_label(part)
    points = hv.Points(nodes, kdims=["x", "y"], vdims=["node", "part", "color"]).opts(
        color="color", size=4, line_color=None, tools=["hover"], backend="bokeh",
    )
    title = f"{n} nodes coloured by {label} ({part.num_parts} {label}s)"
    return (segments * points).opts(
        title=title, xaxis=None, yaxis=None, responsive=True, height=400, backend="bokeh",
    )
