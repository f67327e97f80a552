"""A run's life on a cluster: it waits for the workers it needs (a full cluster is never read as
empty, a restarting worker is waited for up to the run's timeout), ``stop()`` on a run that
ended does nothing, and a script may end right after ``run.stop()`` on a background run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import dask
import pytest
from distributed import Event

import gnnpipe as gp


def _model(graph, layers: int = 2):
    return gp.models.gcn(graph.num_features, hidden=8, out_dim=4, layers=layers, dropout=0.0)


def test_a_full_cluster_is_never_read_as_empty(small_graph):
    """The client's periodic refresh (here every 1 ms, 2 s by default) caches an identity
    listing no workers: a run that read the workers from that cache saw "the cluster has 0"."""
    with dask.config.set({"distributed.client.scheduler-info-interval": "1ms"}):
        cluster = gp.Cluster(n_workers=2)
    with cluster:
        cluster.ready(2)
        assert [len(cluster.workers()) for _ in range(300)] == [2] * 300
        run = gp.train(_model(small_graph), small_graph, "pipeline", stages=2, chunks=4,
                       epochs=2, cluster=cluster, progress=False)
        assert len(run.history) == 2


def test_workers_start_with_gnnpipe_imported_and_keep_a_users_preload(monkeypatch):
    """A plan's profile or a run's first task on a running cluster does not wait seconds for
    torch and PyG to import; a ``preload`` the user gives is imported too. Workers given a
    memory_limit use the lean allocator (a rank then holds what it uses)."""
    from gnnpipe.runtime.cluster import PRELOAD

    monkeypatch.delenv("GNNPIPE_ALLOCATOR", raising=False)
    loaded = "[m in __import__('sys').modules for m in {!r}]"  # builtins only: ships no module
    lean = "__import__('os').environ.get('MALLOC_MMAP_THRESHOLD_')"
    with gp.Cluster(n_workers=1, preload="colorsys", memory_limit="2GiB") as cluster:
        found = cluster.client.run(eval, loaded.format(
            [*PRELOAD, "torch_geometric", "colorsys"]))
        threshold = cluster.client.run(eval, lean)
    assert list(found.values()) == [[True] * (len(PRELOAD) + 2)]
    assert list(threshold.values()) == ["1048576"]
    with gp.Cluster(n_workers=1) as free:  # no limit: 2 MiB pages, glibc's own threshold
        assert list(free.client.run(eval, lean).values()) == [None]


def test_a_run_waits_for_a_restarting_worker_up_to_its_timeout(small_graph):
    with gp.Cluster(n_workers=2) as cluster:
        address = cluster.client.scheduler.address
        victim = cluster.workers()[1]
        pid = cluster.client.run(os.getpid, workers=[victim])[victim]
        # However slowly its nanny restarts it, LocalCluster must not give the worker up.
        with dask.config.set({"distributed.deploy.lost-worker-timeout": "600s"}):
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while victim in cluster.workers() and time.monotonic() < deadline:
                time.sleep(0.05)  # until the scheduler has seen the worker die
            assert victim not in cluster.workers()
            # Through its address the cluster's size is unknown: the run waits for 2 workers.
            run = gp.train(_model(small_graph), small_graph, "pipeline", stages=2, chunks=4,
                           epochs=2, cluster=address, timeout=120, progress=False)
        assert len(run.history) == 2
        with pytest.raises(ValueError, match=r"cluster: the run needs 3 workers \(one per rank\), "
                                             r"the cluster has 2 after waiting \d+ s "
                                             r"\(timeout=1 s\)"):
            gp.train(_model(small_graph, layers=3), small_graph, "pipeline", stages=3, chunks=4,
                     epochs=2, cluster=address, timeout=1, progress=False)


@pytest.mark.parametrize("own", [True, False], ids=["own-cluster", "shared-cluster"])
def test_stop_after_the_run_ended_does_nothing(request, small_graph, own):
    cluster = None if own else request.getfixturevalue("cluster")
    run = gp.train(_model(small_graph), small_graph, "pipeline", stages=2, chunks=4, epochs=2,
                   cluster=cluster, progress=False)
    assert run.done
    run.stop()  # its own cluster is closed: the stop event's client is gone
    run.stop()
    assert run.wait() is run and len(run.history) == 2
    if cluster is not None:  # nothing was sent to the scheduler
        assert not Event(run.spec.stop_event, client=cluster.client).is_set()


SCRIPT = """
import sys
import time

if __name__ == "__main__":
    import gnnpipe as gp

    data = gp.datasets.synthetic(num_nodes=200, avg_degree=4, num_classes=3, num_features=8,
                                 homophily=0.8, seed=0)
    model = gp.models.gcn(data.num_features, hidden=8, out_dim=3, layers=2, dropout=0.0)
    run = gp.train(model, data, "pipeline", stages=2, epochs=EPOCHS, background=True,
                   progress=False)
    deadline = time.monotonic() + 120
    while len(run.history) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)  # until the first epoch is reported
    if len(run.history) < 1:
        sys.exit("no epoch within 120 s")
    if STOP:
        run.stop()
"""


@pytest.mark.parametrize("stop", [True, False], ids=["stopped", "left-training"])
def test_a_script_ends_cleanly_after_starting_a_background_run(tmp_path, stop):
    """The run's thread closes the cluster it owns before the interpreter finalizes: stopped,
    or (left training) stopped by gnnpipe when the main thread ends, without waiting for its
    100,000 epochs."""
    script = tmp_path / "background.py"
    epochs = 1000 if stop else 100_000
    script.write_text(textwrap.dedent(SCRIPT).replace("EPOCHS", str(epochs))
                      .replace("STOP", str(stop)))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          check=False,
                          timeout=400, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "Exception in thread" not in done.stderr, done.stderr
    if not stop:
        assert "stopping it at the next epoch boundary" in done.stderr
