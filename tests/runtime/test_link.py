"""What a message between two ranks costs, measured on real Dask workers over gloo."""

from __future__ import annotations

import gnnpipe as gp
from gnnpipe.runtime.link import measure_link


def test_a_swap_between_two_workers_has_a_latency_and_a_bandwidth(cluster):
    latency, bandwidth = measure_link(cluster)
    assert 0 < latency < 1.0  # seconds for a swap of one value on loopback
    assert bandwidth > 1e6  # bytes/s of a 4 MiB swap
    # the workers are usable for a run afterwards (the probe's process group is gone)
    assert cluster.ready(2)


def test_a_plan_prices_messages_as_the_profile_measured_them(cluster, small_graph):
    model = gp.models.gcn(small_graph.num_features, hidden=8, out_dim=4, layers=2)
    plan = gp.plan(model, small_graph, 2, cluster=cluster, repeats=1, modes=["graph"])
    assert plan.profile.bandwidth > 0 and plan.profile.latency > 0
    assert (plan.bandwidth, plan.latency) == (plan.profile.bandwidth, plan.profile.latency)
    given = gp.plan(model, small_graph, 2, bandwidth="1MB/s", latency=0.01,
                    profile=plan.profile, modes=["graph"])
    assert (given.bandwidth, given.latency) == (1e6, 0.01)
