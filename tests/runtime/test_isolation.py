"""Isolation: a failed run frees only its own stuck workers (other clients' tasks and other runs
keep running), concurrent runs spread over free workers, and a hung rank is the one blamed."""

from __future__ import annotations

import logging
import sys
import time
import uuid

import cloudpickle
import pytest
from distributed import Client, Event

import gnnpipe as gp
from gnnpipe.models import Block
from gnnpipe.runtime.launch import RankFailure

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/


class StallingBlock(Block):
    """Passes ``h`` through; in the forward of epoch ``epoch`` it raises, or (``hang``) sleeps
    far longer than any test's timeout."""

    def __init__(self, width: int, epoch: int, hang: bool) -> None:
        super().__init__()
        self.in_dim = self.out_dim = width
        self.epoch, self.hang = epoch, hang

    def forward(self, h, h0, ctx):
        if ctx.training and getattr(ctx, "epoch", 0) == self.epoch:
            if self.hang:
                time.sleep(3600)
            raise FloatingPointError(f"injected failure at epoch {self.epoch}")
        return h, h0


def _model(graph, stall_at: int | None = None, hang: bool = False):
    """A GCN; with ``stall_at``, a last block (on the last pipeline stage) that fails there."""
    model = gp.models.gcn(graph.num_features, hidden=8, out_dim=4, layers=4, dropout=0.0)
    if stall_at is not None:
        model.blocks.append(StallingBlock(4, stall_at, hang))
        model.blocks[-1].key = len(model.blocks) - 1
    return model


def _held(name: str) -> int:
    """A bystander task: runs until the test sets the Event ``name``."""
    if not Event(name).wait(timeout=300):
        raise TimeoutError("the test never released the bystander")
    return 42


def _start_bystander(client: Client, worker: str) -> tuple[object, Event]:
    """Submit :func:`_held` to ``worker`` from ``client``; return it once it is running."""
    release = Event(f"bystander-{uuid.uuid4().hex[:8]}", client=client)
    task = client.submit(_held, release.name, workers=[worker], pure=False)
    deadline = time.monotonic() + 60
    while task.key not in client.processing().get(worker, []) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert task.key in client.processing()[worker]
    return task, release


def test_a_failing_run_leaves_another_clients_task_running(small_graph):
    with gp.Cluster(n_workers=4) as cluster, Client(cluster.client.scheduler.address) as other:
        task, release = _start_bystander(other, cluster.workers()[-1])
        with pytest.raises(RankFailure, match=r"rank 1 failed: FloatingPointError: injected"):
            gp.train(_model(small_graph, stall_at=1), small_graph, "pipeline", stages=2, chunks=4,
                     epochs=20, cluster=cluster, timeout=60, progress=False)
        assert task.status == "pending"  # still running: not cancelled by the failed run
        release.set()
        assert task.result(timeout=60) == 42


def test_a_hung_rank_is_blamed_and_only_its_worker_restarts(small_graph):
    with gp.Cluster(n_workers=3) as cluster, Client(cluster.client.scheduler.address) as other:
        task, release = _start_bystander(other, cluster.workers()[-1])
        with pytest.raises(RankFailure) as failure:
            gp.train(_model(small_graph, stall_at=1, hang=True), small_graph, "pipeline",
                     stages=2, chunks=4, epochs=20, cluster=cluster, timeout=5, progress=False)
        assert failure.value.rank == 1
        assert "stopped answering (its peers timed out waiting for it)" in failure.value.cause
        assert task.status == "pending"  # the stuck rank's worker restarted, not the bystander's
        release.set()
        assert task.result(timeout=60) == 42
        assert len(cluster.ready(3)) == 3


def test_concurrent_runs_spread_over_free_workers(cluster, small_graph, caplog):
    runs = [gp.train(_model(small_graph), small_graph, "pipeline", stages=2, chunks=4,
                     epochs=100_000, cluster=cluster, background=True, progress=False)
            for _ in range(2)]
    try:
        deadline = time.monotonic() + 120
        while min(len(r.history) for r in runs) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(len(r.history) >= 2 for r in runs)  # both train at the same time
        with caplog.at_level(logging.WARNING, logger="gnnpipe.runtime.placement"), \
                pytest.raises(TimeoutError, match="the run needs 2 workers free of other gnnpipe"):
            gp.train(_model(small_graph), small_graph, "pipeline", stages=2, chunks=4, epochs=1,
                     cluster=cluster, timeout=2, progress=False)
        assert "the run waits for busy workers" in caplog.text  # said so, then gave up
    finally:
        for r in runs:
            r.stop()
        for r in runs:
            r.wait(timeout=120)
    first, second = (set(r.workers) for r in runs)
    assert len(first) == len(second) == 2 and not first & second
    assert first | second == set(cluster.workers())
