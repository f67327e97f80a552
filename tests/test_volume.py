"""comm_volume: the byte formulas of docs/design.md §5."""

from __future__ import annotations

import pytest

import gnnpipe as gp


def test_pipeline_bytes_follow_the_formula(cora):
    n, d = cora.num_nodes, 64
    gcn = gp.models.gcn(cora.num_features, hidden=d, out_dim=7, layers=32)
    for stages in (2, 4):
        assert gp.comm_volume(gcn, cora, "pipeline", stages=stages) == 2 * (stages - 1) * n * d * 4
    gcnii = gp.models.gcnii(cora.num_features, hidden=d, out_dim=7, layers=32)
    assert gp.comm_volume(gcnii, cora, "pipeline", stages=2) == 2 * 2 * n * d * 4  # h0 doubles it


def test_graph_bytes_follow_the_formula(cora):
    model = gp.models.gcnii(cora.num_features, hidden=64, out_dim=7, layers=32)
    part = gp.partition(cora, 4, method="metis")
    expected = 2 * 32 * 64 * part.total_halo_rows * 4
    assert gp.comm_volume(model, cora, "graph", parts=4, partitioning=part) == expected
    assert gp.comm_volume(model, cora, "single") == gp.comm_volume(model, cora, "local") == 0


def test_hybrid_is_pipeline_plus_halo_between_ways(cora):
    model = gp.models.gcn(cora.num_features, hidden=16, out_dim=7, layers=8)
    part = gp.partition(cora, 2)
    hybrid = gp.comm_volume(model, cora, "hybrid", stages=2, ways=2, partitioning=part)
    assert hybrid == (gp.comm_volume(model, cora, "pipeline", stages=2)
                      + gp.comm_volume(model, cora, "graph", parts=2, partitioning=part))


def test_bad_mode_and_mismatched_partitioning(cora):
    model = gp.models.gcn(cora.num_features, out_dim=7)
    with pytest.raises(ValueError, match="mode: unknown mode"):
        gp.comm_volume(model, cora, "ring")
    with pytest.raises(ValueError, match="partitioning: has 2 parts but the mode needs 4"):
        gp.comm_volume(model, cora, "graph", parts=4, partitioning=gp.partition(cora, 2))
