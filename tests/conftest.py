"""Shared fixtures: seeded torch, small graphs, Cora; the data root and no downloads."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

import gnnpipe as gp

# One torch thread per test process: on a 2-core machine shared with Dask workers, OpenMP
# threads spinning against each other slow small ops down by 10-100x.
torch.set_num_threads(1)

# The named datasets come from ../shared/data beside the checkout (CI has it there), and nothing
# in the suite downloads: any download goes to the discard port and fails at once, unless a test
# points GNNPIPE_DATA_URL at its own server. Set here, before any worker or kernel starts, so
# Dask workers and notebook kernels inherit both.
_SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
if "GNNPIPE_DATA" not in os.environ and _SHARED_DATA.is_dir():
    os.environ["GNNPIPE_DATA"] = str(_SHARED_DATA)
os.environ.setdefault("GNNPIPE_DATA_URL", "http://127.0.0.1:9")


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
def small_gcnii(small_graph):
    """A 4-layer GCNII (hidden 16) for ``small_graph``: the planner's tests plan it."""
    torch.manual_seed(0)
    return gp.models.gcnii(small_graph.num_features, hidden=16, out_dim=4, layers=4)


@pytest.fixture(scope="session")
def small_profile(small_gcnii, small_graph):
    """``small_gcnii``'s profile on ``small_graph`` (4 chunks, 2 timed epochs)."""
    from gnnpipe.plan import profile_model

    return profile_model(small_gcnii, small_graph, chunks=4, repeats=2)


@pytest.fixture(scope="session")
def cluster():
    """A real local Dask cluster of 4 worker processes, shared by the tests that ask for it."""
    with gp.Cluster(n_workers=4) as c:
        yield c


#: Debian's Chromium (.ci/run installs it), which Playwright drives for the browser tests.
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="session")
def browser():
    """Headless Chromium through Playwright, one for the session (each test opens its pages)."""
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium not found at {CHROMIUM}: .ci/run installs Debian's chromium package")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        yield b
        b.close()
