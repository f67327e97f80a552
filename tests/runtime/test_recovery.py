"""Recovery: with ``restarts=k`` a run whose worker is killed (or whose rank raises) restarts every
rank from the newest checkpoint and ends exactly like a run never interrupted; past ``k``
restarts it fails naming the rank, as without restarts."""

from __future__ import annotations

import copy
import os
import signal
import sys
import time

import cloudpickle
import dask
import pytest
import torch
from failing_blocks import fail_at

import gnnpipe as gp
from gnnpipe import checkpoint as ckpt
from gnnpipe.runtime.launch import FailureKind, RankFailure
from gnnpipe.runtime.placement import rank_key

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/

LAYOUT = {"stages": 2, "chunks": 4}


def _model(graph):
    return gp.models.gcn(graph.num_features, hidden=8, out_dim=4, layers=3, dropout=0.3)


def _worker_of(cluster, run, rank: int, deadline: float) -> str:
    key = rank_key(run.launch.run_id, rank)
    while time.monotonic() < deadline:
        for worker, keys in cluster.client.processing().items():
            if key in keys:
                return worker
        time.sleep(0.05)
    raise AssertionError(f"rank {rank} was never seen running")


def test_a_killed_worker_is_replaced_and_the_run_ends_as_if_uninterrupted(cluster, small_graph,
                                                                          tmp_path):
    epochs = 80
    initial = _model(small_graph)
    full_model, model = copy.deepcopy(initial), copy.deepcopy(initial)
    gp.train(full_model, small_graph, "pipeline", epochs=epochs, cluster=cluster, progress=False,
             **LAYOUT)
    run = gp.train(model, small_graph, "pipeline", epochs=epochs, checkpoint=tmp_path,
                   checkpoint_every=5, restarts=1, cluster=cluster, background=True,
                   timeout=120, progress=False, **LAYOUT)
    deadline = time.monotonic() + 120
    victim = _worker_of(cluster, run, 1, deadline)
    while ckpt.latest(tmp_path) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not run.done, "the run ended before the kill: give it more epochs"
    pid = cluster.client.run(os.getpid, workers=[victim])[victim]
    with dask.config.set({"distributed.deploy.lost-worker-timeout": "0s"}):
        os.kill(pid, signal.SIGKILL)
        run.wait(timeout=300)
    events = run.events
    assert events["event"].tolist() == ["restart"]
    assert events["rank"].tolist() == [1] and events["cause"].tolist() == ["its worker process died"]
    restart_epoch = int(events["epoch"].iloc[0])
    assert restart_epoch > 0 and restart_epoch % 5 == 0  # from a checkpoint, not from scratch
    history = run.history
    assert history["epoch"].tolist() == list(range(epochs))
    assert (history["restarts"] == (history["epoch"] >= restart_epoch)).all()
    for (name, a), b in zip(model.state_dict().items(), full_model.state_dict().values()):
        assert torch.equal(a, b), name
    assert len(cluster.ready(4)) == 4


def test_past_its_restarts_a_run_fails_naming_the_rank(cluster, small_graph, tmp_path):
    model = _model(small_graph)
    fail_at(model, epoch=3)
    run = gp.train(model, small_graph, "pipeline", epochs=20, checkpoint=tmp_path,
                   checkpoint_every=2, restarts=1, cluster=cluster, background=True,
                   progress=False, **LAYOUT)
    with pytest.raises(RankFailure, match="rank 1 failed: FloatingPointError: injected") as err:
        run.wait(timeout=300)
    assert err.value.kind is FailureKind.RAISED
    assert run.events[["epoch", "event", "rank"]].values.tolist() == [[2, "restart", 1]]
    assert run.history["epoch"].tolist() == [0, 1, 2]  # the second attempt's, from epoch 2
