"""Tests for dashboard.views.partitions: sizes, edge heatmap, halo rows and the node layout."""

from __future__ import annotations

import holoviews as hv
import numpy as np
import pytest

import gnnpipe as gp
from dashboard.views.partitions import (
    MEASURE_COLORS,
    PART_COLORS,
    edge_matrix_plot,
    halo_plot,
    node_layout_plot,
    node_positions,
    part_color,
    partition_sizes_plot,
)


@pytest.fixture(scope="module")
def graph():
    return gp.datasets.synthetic(500, seed=0)


@pytest.fixture(scope="module")
def part(graph) -> gp.Partitioning:
    return gp.partition(graph, 4)


def test_sizes_bars_hold_nodes_and_edges_per_part(graph, part) -> None:
    el = partition_sizes_plot(part)
    assert isinstance(el, hv.Bars)
    assert [d.name for d in el.kdims] == ["part", "measure"]
    assert len(el) == 8
    df = el.dframe()
    assert list(dict.fromkeys(df["part"])) == ["0", "1", "2", "3"]  # categories, not numbers
    nodes = df[df["measure"] == "nodes"]
    edges = df[df["measure"] == "edges"]
    np.testing.assert_array_equal(nodes["count"], part.sizes)
    np.testing.assert_array_equal(edges["count"], part.edge_counts)
    assert nodes["count"].sum() == graph.num_nodes == 500
    assert edges["count"].sum() == graph.edge_index.size(1)
    assert set(df["color"]) == set(MEASURE_COLORS.values())
    fig = hv.render(el, backend="bokeh")
    assert fig.title.text.startswith("4 parts: balance nodes")
    assert [f for f, _ in fig.x_range.factors[:2]] == ["0", "0"]


def test_sizes_of_a_chunking_say_chunk(graph) -> None:
    el = partition_sizes_plot(gp.chunk(graph, 3))
    assert el.kdims[0].label == "chunk" and len(el) == 6
    assert el.opts.get().kwargs["title"].startswith("3 chunks")


def test_edge_heatmap_matches_edge_matrix(graph, part) -> None:
    el = edge_matrix_plot(part)
    assert isinstance(el, hv.HeatMap)
    assert [d.name for d in el.kdims] == ["dst_part", "src_part"]
    assert len(el) == 16
    assert el.dimension_values("edges").sum() == graph.edge_index.size(1)
    matrix = part.edge_matrix()
    for row in el.dframe().itertuples():
        assert row.edges == matrix.loc[int(row.src_part), int(row.dst_part)]
    diag = el.dframe().query("src_part == dst_part")["edges"].sum()
    assert list(hv.render(el, backend="bokeh").x_range.factors) == ["0", "1", "2", "3"]
    assert diag == np.trace(matrix.to_numpy()) and diag > matrix.to_numpy().sum() / 2
    fig = hv.render(el, backend="bokeh")
    assert f"cut {part.edge_cut_fraction:.1%}" in fig.title.text


def test_halo_bars(part) -> None:
    el = halo_plot(part)
    assert isinstance(el, hv.Bars) and len(el) == 4
    np.testing.assert_array_equal(el.dimension_values("halo_rows"), part.halo_rows)
    assert el.dimension_values("halo_rows").sum() == part.total_halo_rows > 0
    assert list(el.dimension_values("color")) == list(PART_COLORS[:4])
    assert f"M = {part.total_halo_rows}" in hv.render(el, backend="bokeh").title.text


def test_part_colours_cycle() -> None:
    assert part_color(0) == PART_COLORS[0]
    assert part_color(len(PART_COLORS) + 2) == PART_COLORS[2]
    assert len(set(PART_COLORS)) == len(PART_COLORS)


def test_node_layout_points_and_segments(graph, part) -> None:
    el = node_layout_plot(graph, part)
    assert isinstance(el, hv.Overlay)
    segments, points = el.Segments.I, el.Points.I
    assert len(points) == 500
    np.testing.assert_array_equal(points.dimension_values("node"), np.arange(500))
    np.testing.assert_array_equal(points.dimension_values("part"), part.assignment.numpy())
    assert list(points.dimension_values("color")) == [
        PART_COLORS[p] for p in part.assignment.tolist()]
    ei = graph.edge_index.numpy()
    undirected = {(min(a, b), max(a, b)) for a, b in ei.T if a != b}
    assert len(segments) == len(undirected)
    assert np.isfinite(points.dimension_values("x")).all()
    hv.render(el, backend="bokeh")


def test_node_layout_clusters_by_part(graph, part) -> None:
    pos = node_positions(graph.edge_index.numpy(), part.assignment.numpy(), 4)
    again = node_positions(graph.edge_index.numpy(), part.assignment.numpy(), 4)
    np.testing.assert_array_equal(pos, again)  # deterministic
    labels = part.assignment.numpy()
    centroids = np.stack([pos[labels == p].mean(axis=0) for p in range(4)])
    nearest = np.argmin(((pos[:, None, :] - centroids[None]) ** 2).sum(-1), axis=1)
    assert (nearest == labels).mean() > 0.9


def test_node_layout_draws_the_part_graph_above_max_nodes(graph, part) -> None:
    el = node_layout_plot(graph, part, max_nodes=100)
    assert isinstance(el, hv.Overlay)
    segments, points = el.Segments.I, el.Points.I
    assert list(points.dimension_values("part")) == ["0", "1", "2", "3"]
    np.testing.assert_array_equal(points.dimension_values("nodes"), part.sizes)
    matrix = part.edge_matrix().to_numpy()
    cut = matrix.sum() - np.trace(matrix)
    assert segments.dimension_values("edges").sum() == cut > 0
    title = el.opts.get().kwargs["title"]
    assert title.startswith("500 nodes > 100: part graph")
    el.opts(width=300, height=300, responsive=False)  # plot options apply (not a Div)
    hv.render(el, backend="bokeh")


def test_chunk_graph_of_a_large_graph() -> None:
    big = gp.datasets.synthetic(20_000, seed=1)
    chunks = gp.chunk(big, 8)
    el = node_layout_plot(big, chunks)
    assert len(el.Points.I) == 8
    assert "20,000 nodes > 3,000: chunk graph (8 chunks" in el.opts.get().kwargs["title"]
    hv.render(el, backend="bokeh")
