"""Shared fixtures: seeded torch, small graphs, Cora."""

from __future__ import annotations

import pytest
import torch

import gnnpipe as gp

# One torch thread per test process: on a 2-core machine shared with Dask workers, OpenMP
# threads spinning against each other slow small ops down by 10-100x.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed_torch() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def cora():
    return gp.datasets.load("cora")


@pytest.fixture(scope="session")
def small_graph():
    """A 600-node planted-partition graph: quick to train, big enough for 8 chunks."""
    return gp.datasets.synthetic(num_nodes=600, avg_degree=8, num_classes=4, num_features=24,
                                 homophily=0.8, seed=3)


@pytest.fixture(scope="session")
def cluster():
    """A real local Dask cluster of 4 worker processes, shared by the tests that ask for it."""
    with gp.Cluster(n_workers=4) as c:
        yield c
