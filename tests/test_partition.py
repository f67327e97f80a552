"""Tests for gnnpipe.partition: partitions, chunking, metrics and renumbering."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pandas as pd
import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.utils import degree, to_undirected

from gnnpipe.partition import METHODS, Partitioning, chunk, partition


# ----------------------------------------------------------------------------- graphs
def make_graph(src, dst, num_nodes: int, symmetric: bool = True, **attrs) -> Data:
    """A Data from edge lists; symmetrized and coalesced unless ``symmetric=False``."""
    ei = torch.as_tensor(np.stack([np.asarray(src), np.asarray(dst)]), dtype=torch.long)
    if symmetric:
        ei = to_undirected(ei, num_nodes=num_nodes)
    return Data(edge_index=ei, num_nodes=num_nodes, **attrs)


def ring(n: int) -> Data:
    src = np.arange(n)
    return make_graph(src, (src + 1) % n, n)


def two_cliques(k: int = 10) -> Data:
    """Two k-cliques (nodes 0..k-1 and k..2k-1) joined by the single edge (k-1, k)."""
    pairs = [(u, v) for u, v in itertools.combinations(range(k), 2)]
    pairs += [(u + k, v + k) for u, v in pairs] + [(k - 1, k)]
    src, dst = zip(*pairs)
    return make_graph(src, dst, 2 * k)


def planted(n: int = 2000, blocks: int = 8, edges: int = 10_000, p_in: float = 0.9,
            seed: int = 0) -> Data:
    """Planted partition: block of v is v // (n / blocks); a fraction p_in of edges inside."""
    rng = np.random.default_rng(seed)
    size = n // blocks
    src = rng.integers(0, n, edges)
    inside = (src // size) * size + rng.integers(0, size, edges)
    dst = np.where(rng.random(edges) < p_in, inside, rng.integers(0, n, edges))
    keep = src != dst
    labels = torch.from_numpy(np.arange(n) // size)
    x = torch.randn(n, 4, generator=torch.Generator().manual_seed(seed))
    mask = torch.from_numpy(rng.random(n) < 0.3)
    return make_graph(src[keep], dst[keep], n, x=x, y=labels, train_mask=mask)


def random_graph(n: int = 60, edges: int = 200, seed: int = 0, symmetric: bool = True) -> Data:
    rng = np.random.default_rng(seed)
    return make_graph(rng.integers(0, n, edges), rng.integers(0, n, edges), n, symmetric)


def build(kind: str, data: Data, parts: int, seed: int = 0) -> Partitioning:
    if kind == "chunk":
        return chunk(data, parts, seed=seed)
    return partition(data, parts, method=kind, seed=seed)


# ----------------------------------------------------------------------- structure
@pytest.mark.parametrize("kind", [*METHODS, "chunk"])
@pytest.mark.parametrize("parts", [1, 2, 5, 8])
def test_perm_and_bounds(kind, parts):
    data = planted()
    p = build(kind, data, parts)
    n = data.num_nodes
    perm, inv = p.perm.numpy(), p.inv_perm.numpy()
    assert np.array_equal(np.sort(perm), np.arange(n))
    assert np.array_equal(perm[inv], np.arange(n))
    assert np.array_equal(inv[perm], np.arange(n))
    bounds = p.bounds.numpy()
    assert bounds.shape == (parts + 1,) and bounds[0] == 0 and bounds[-1] == n
    assert np.all(np.diff(bounds) > 0)  # no empty part
    new_part = p.assignment.numpy()[perm]  # part of each new position
    assert np.array_equal(new_part, np.repeat(np.arange(parts), np.diff(bounds)))
    assert p.assignment.dtype == torch.long and p.num_parts == parts


@pytest.mark.parametrize("num_chunks", [2, 4, 8])
def test_chunks_balanced(num_chunks):
    p = chunk(planted(), num_chunks, seed=0)
    assert p.node_balance < 1.1
    assert p.edge_balance < 1.2
    assert p.method == "chunk"


def test_chunks_cut_fewer_edges_than_random():
    data = planted()
    p = chunk(data, 2, seed=0)
    # Chunks merge METIS parts, so they cut far fewer edges than a random split.
    assert p.edge_cut < 0.5 * partition(data, 2, "random").edge_cut


def test_random_and_contiguous_sizes_exact():
    data = ring(103)
    for method in ("random", "contiguous"):
        sizes = partition(data, 4, method).sizes
        assert sizes.max() - sizes.min() <= 1 and sizes.sum() == 103


def test_contiguous_is_id_ranges():
    p = partition(ring(10), 3, "contiguous")
    assert p.assignment.tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert torch.equal(p.perm, torch.arange(10))


def test_single_part_needs_no_metis(monkeypatch):
    import pymetis

    def boom(*args, **kwargs):
        raise AssertionError("METIS must not run for one part")

    monkeypatch.setattr(pymetis, "part_graph", boom)
    data = planted()
    for method in METHODS:
        p = partition(data, 1, method)
        assert not p.assignment.any() and p.edge_cut == 0 and p.total_halo_rows == 0
    c = chunk(data, 1)
    assert torch.equal(c.perm, torch.arange(data.num_nodes))
    assert c.bounds.tolist() == [0, data.num_nodes]


def test_tiny_graph_more_chunks_than_quarter_nodes():
    data = ring(10)  # 4 * 4 = 16 METIS parts wanted, only 10 nodes
    p = chunk(data, 4, seed=0)
    assert p.sizes.sum() == 10 and (p.sizes > 0).all()
    p = chunk(data, 10, seed=0)
    assert (p.sizes == 1).all()


def test_edgeless_graph():
    data = Data(edge_index=torch.empty(2, 0, dtype=torch.long), num_nodes=12)
    p = partition(data, 3, "metis")
    assert (p.sizes > 0).all() and p.edge_cut == 0 and p.edge_cut_fraction == 0.0
    assert p.edge_balance == 1.0
    assert chunk(data, 3).sizes.sum() == 12


# ---------------------------------------------------------------------- determinism
def test_deterministic_per_seed():
    data = planted()
    for kind in ("metis", "random", "chunk"):
        a, b = build(kind, data, 4, seed=7), build(kind, data, 4, seed=7)
        assert torch.equal(a.assignment, b.assignment) and torch.equal(a.perm, b.perm)
    base = chunk(data, 4, seed=0).assignment
    assert any(not torch.equal(base, chunk(data, 4, seed=s).assignment) for s in (1, 2, 3))
    base = partition(data, 4, "random", seed=0).assignment
    assert not torch.equal(base, partition(data, 4, "random", seed=1).assignment)


# -------------------------------------------------------------------------- quality
def test_two_cliques_cut_one_edge():
    p = partition(two_cliques(10), 2, "metis")
    assert p.edge_cut == 1
    assert p.sizes.tolist() == [10, 10]
    assert p.halo_rows.tolist() == [1, 1] and p.total_halo_rows == 2
    assert p.edge_cut_fraction == pytest.approx(1 / 91)


def test_metis_beats_random_on_planted_partition():
    data = planted()
    metis, rand = partition(data, 8, "metis"), partition(data, 8, "random")
    assert metis.edge_cut <= 0.3 * rand.edge_cut
    assert metis.total_halo_rows < rand.total_halo_rows
    assert metis.node_balance < 1.1


def test_ring_contiguous_metrics():
    p = partition(ring(12), 4, "contiguous")
    assert p.edge_cut == 4
    assert p.halo_rows.tolist() == [2, 2, 2, 2]
    assert p.edge_counts.tolist() == [6, 6, 6, 6]
    assert p.node_balance == 1.0 and p.edge_balance == 1.0


# ------------------------------------------------------------- metrics vs brute force
def brute_force(data: Data, assignment: list[int], parts: int):
    src, dst = data.edge_index.tolist()
    halo = [set() for _ in range(parts)]
    matrix = np.zeros((parts, parts), dtype=np.int64)
    cut, pairs = set(), set()
    for u, v in zip(src, dst):
        pu, pv = assignment[u], assignment[v]
        matrix[pu, pv] += 1
        if u != v:
            pairs.add(frozenset((u, v)))
        if pu != pv:
            halo[pv].add(u)
            cut.add(frozenset((u, v)))
    return [len(h) for h in halo], matrix, len(cut), len(pairs)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("kind", [*METHODS, "chunk"])
def test_metrics_match_brute_force(kind, symmetric):
    data = random_graph(symmetric=symmetric)
    p = build(kind, data, 4, seed=3)
    halo, matrix, cut, pairs = brute_force(data, p.assignment.tolist(), 4)
    assert p.halo_rows.tolist() == halo
    assert p.total_halo_rows == sum(halo)
    assert np.array_equal(p.edge_matrix().to_numpy(), matrix)
    assert p.edge_matrix().to_numpy().sum() == data.num_edges
    assert p.edge_counts.tolist() == matrix.sum(axis=0).tolist()
    assert p.edge_cut == cut
    assert p.edge_cut_fraction == pytest.approx(cut / pairs)
    assert p.sizes.tolist() == np.bincount(p.assignment.numpy(), minlength=4).tolist()


def test_edge_cut_counts_undirected_pairs():
    # 0->1 once, 1->2 both ways twice (duplicates), a self-loop on 3; parts {0,2}, {1,3}.
    ei = torch.tensor([[0, 1, 2, 1, 2, 3], [1, 2, 1, 2, 1, 3]])
    data = Data(edge_index=ei, num_nodes=4)
    p = partition(data, 2, "contiguous")  # parts {0, 1}, {2, 3}
    assert p.edge_cut == 1  # only {1, 2} crosses
    assert p.edge_matrix().to_numpy().tolist() == [[1, 2], [2, 1]]
    assert p.halo_rows.tolist() == [1, 1]


def test_summary_and_repr():
    p = partition(planted(), 4, "metis")
    s = p.summary()
    assert isinstance(s, pd.DataFrame)
    assert list(s.columns) == ["part", "nodes", "edges", "halo_rows"] and len(s) == 4
    assert s["nodes"].sum() == 2000 and s["edges"].sum() == p.edge_index.size(1)
    m = p.edge_matrix()
    assert m.shape == (4, 4) and m.index.name == "src_part"
    m.iloc[0, 0] = -1  # the returned table is a copy
    assert p.edge_matrix().iloc[0, 0] >= 0
    text = repr(p)
    assert "metis" in text and "edge_cut=" in text and "total_halo_rows=" in text


# --------------------------------------------------------------------------- apply
@pytest.mark.parametrize("kind", ["metis", "random", "chunk"])
def test_apply_renumbers_isomorphically(kind):
    data = planted()
    p = build(kind, data, 4, seed=1)
    new = p.apply(data)
    inv, perm = p.inv_perm, p.perm
    assert new.num_nodes == data.num_nodes and new.num_edges == data.num_edges
    # Degree multiset preserved, and degrees follow the nodes.
    deg_old = degree(data.edge_index[1], data.num_nodes)
    deg_new = degree(new.edge_index[1], new.num_nodes)
    assert Counter(deg_old.tolist()) == Counter(deg_new.tolist())
    assert torch.equal(deg_new, deg_old[perm])
    # The same edges, renamed.
    assert torch.equal(new.edge_index, inv[data.edge_index])
    # Labels, features and masks follow their nodes.
    assert torch.equal(new.y[inv], data.y)
    assert torch.equal(new.x[inv], data.x)
    assert torch.equal(new.train_mask[inv], data.train_mask)
    # In the new order each part is the id range given by bounds.
    b = p.bounds.tolist()
    for c in range(p.num_parts):
        assert (p.assignment[perm[b[c]:b[c + 1]]] == c).all()
    # The original Data is untouched.
    assert torch.equal(data.y, planted().y)


def test_apply_rejects_other_graph():
    p = partition(ring(10), 2, "contiguous")
    with pytest.raises(ValueError, match="data"):
        p.apply(ring(11))


# ------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"num_parts": 0}, "num_parts"),
        ({"num_parts": -2}, "num_parts"),
        ({"num_parts": 11}, "num_parts"),
        ({"num_parts": 2.5}, "num_parts"),
        ({"num_parts": 2, "method": "foo"}, "method"),
        ({"num_parts": 2, "seed": -1}, "seed"),
    ],
)
def test_partition_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        partition(ring(10), **kwargs)


def test_unknown_method_lists_choices():
    with pytest.raises(ValueError, match="metis, random, contiguous"):
        partition(ring(10), 2, method="foo")


@pytest.mark.parametrize("num_chunks", [0, 11, True])
def test_chunk_bad_arguments(num_chunks):
    with pytest.raises(ValueError, match="num_chunks"):
        chunk(ring(10), num_chunks)


def test_bad_graph():
    with pytest.raises(ValueError, match="edge_index"):
        partition(Data(edge_index=torch.tensor([[0, 5], [1, 0]]), num_nodes=3), 2)
    with pytest.raises(ValueError, match="edge_index"):
        partition(Data(edge_index=torch.zeros(3, 2, dtype=torch.long), num_nodes=3), 2)
    with pytest.raises(ValueError, match="data"):
        partition(object(), 2)


def test_default_chunks_are_metis_parts_and_the_paper_merge_cuts_more():
    """``parts_per_chunk=1``: each chunk is one of METIS's own parts (the same grouping as
    ``partition(..., "metis")`` with that seed); merging 4 parts per chunk at random cuts more."""
    data = planted()
    own = chunk(data, 8, seed=0)
    metis = partition(data, 8, "metis", seed=0)
    groups = {tuple(sorted(metis.assignment[own.assignment == c].unique().tolist()))
              for c in range(8)}
    assert groups == {(p,) for p in range(8)}
    merged = chunk(data, 8, seed=0, parts_per_chunk=4)
    assert own.edge_cut < 0.5 * merged.edge_cut
    assert own.total_halo_rows < merged.total_halo_rows


@pytest.mark.parametrize("value", [0, -1, True, 1.5])
def test_chunk_bad_parts_per_chunk(value):
    with pytest.raises((ValueError, TypeError), match="parts_per_chunk: expected a positive integer"):
        chunk(ring(10), 2, parts_per_chunk=value)
