"""A real local Dask cluster (separate worker processes) shared by the runtime tests."""

from __future__ import annotations

import pytest

import gnnpipe as gp


@pytest.fixture(scope="session")
def cluster():
    with gp.Cluster(n_workers=4) as c:
        yield c
