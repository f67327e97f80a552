"""Failures: a rank that raises or a worker process that dies fails the run fast, naming the
rank; the same cluster then runs the next job. Bad configurations fail before any worker."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import sys
import threading
import time

import cloudpickle
import dask
import pytest
from distributed import Future
from failing_blocks import fail_at, kill_worker

import gnnpipe as gp
from gnnpipe.runtime.asking import WorkerLeft
from gnnpipe.runtime.launch import RankFailure
from gnnpipe.runtime.placement import rank_key
from gnnpipe.runtime.workerenv import Allocator

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/


def _model(graph, explode_at: int | None = None):
    model = gp.models.gcn(graph.num_features, hidden=8, out_dim=4, layers=4, dropout=0.0)
    return model if explode_at is None else fail_at(model, explode_at)


def _running(cluster, graph):
    """A long 2-stage pipeline in the background, once it has trained 2 epochs."""
    run = gp.train(_model(graph), graph, "pipeline", stages=2, chunks=4, epochs=100_000,
                   cluster=cluster, timeout=300, background=True, progress=False)
    trained = threading.Event()

    def check(*_: object) -> None:
        if len(run.history) >= 2:
            trained.set()

    run.subscribe(check)
    check()  # the epochs reported before the subscription
    assert trained.wait(120) and not run.done
    return run


def test_a_rank_that_raises_fails_the_run_naming_it(cluster, small_graph):
    started = time.monotonic()
    with pytest.raises(RankFailure, match=r"rank 1 failed: FloatingPointError: injected failure"):
        gp.train(_model(small_graph, explode_at=2), small_graph, "pipeline", stages=2, chunks=4,
                 epochs=50, cluster=cluster, timeout=300, progress=False)
    assert time.monotonic() - started < 150  # found by the monitor, not the 300 s timeout
    ok = gp.train(_model(small_graph), small_graph, "pipeline", stages=2, chunks=4, epochs=2,
                  cluster=cluster, progress=False)
    assert len(ok.history) == 2


def test_killing_a_worker_fails_fast_and_the_cluster_recovers(cluster, small_graph):
    run = _running(cluster, small_graph)
    key = rank_key(run.launch.run_id, 1)  # rank 1's worker: not always the second one listed
    victim = next(w for w, keys in cluster.client.processing().items() if key in keys)
    pid = cluster.client.run(os.getpid, workers=[victim])[victim]
    killed = time.monotonic()
    # LocalCluster gives up on a worker away longer than this (as a slow restart on a loaded
    # machine does): the cluster must still come back to full size.
    with dask.config.set({"distributed.deploy.lost-worker-timeout": "0s"}):
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(RankFailure, match=r"rank 1 failed: its worker process died") as info:
            run.wait(timeout=200)
    assert time.monotonic() - killed < 150  # found by the monitor, not the 300 s timeout
    # what it last held, and that it was far from its memory_limit: not memory (a signal)
    assert re.search(r"by epoch \d+ the rank's process held up to [\d.]+ [MG]B", str(info.value))
    assert re.search(r"gp.estimate_memory puts its need at [\d.]+ [kMG]B: it was far from its "
                     r"memory_limit, so something else ended its process", str(info.value)
                     ), str(info.value)
    assert len(cluster.ready(4)) == 4
    again = gp.train(_model(small_graph), small_graph, "graph", parts=4, epochs=2, cluster=cluster,
                     progress=False)
    assert len(again.history) == 2


def test_a_rank_task_cancelled_under_the_run_fails_it_naming_the_rank(cluster, small_graph):
    """The scheduler cancels a rank's task when it forgets it (its worker died and took the
    task's inputs along): the run fails with that rank, not Dask's FuturesCancelledError, and
    the workers serve the next run."""
    run = _running(cluster, small_graph)
    key = rank_key(run.launch.run_id, 1)
    cancelled = time.monotonic()
    cluster.client.cancel([Future(key, cluster.client)], force=True)
    with pytest.raises(RankFailure, match=r"rank 1 failed: its task was cancelled by the Dask "
                                          r"scheduler"):
        run.wait(timeout=200)
    assert time.monotonic() - cancelled < 100  # the monitor's grace, not the 300 s timeout
    again = gp.train(_model(small_graph), small_graph, "pipeline", stages=2, chunks=4, epochs=2,
                     cluster=cluster, progress=False)
    assert len(again.history) == 2


@pytest.mark.parametrize(("memory_limit", "asked"), [
    (None, "its resident memory"),  # gp.Cluster's limit: the launcher asks what each holds
    (0, "the run's model and graph"),  # no limit: the graph is sent at once
])
def test_a_worker_that_stops_answering_before_the_ranks_start_fails_the_run_naming_it(
        cluster, small_graph, monkeypatch, memory_limit, asked):
    """A worker stopped (SIGSTOP: as a swapping or wedged process looks) as the launcher sends
    it the graph: nothing watches ranks that do not exist yet, and Dask waits for it forever.
    The run fails within its timeout naming the worker; resumed, the worker serves the next."""
    from gnnpipe.runtime import launch as launcher
    from gnnpipe.runtime.asking import WorkerSilent

    stopped: list[int] = []
    ship = launcher._ship

    def stop_rank_1_then_ship(spec, on, workers):
        stopped.append(on.client.run(os.getpid, workers=[workers[1]])[workers[1]])
        os.kill(stopped[0], signal.SIGSTOP)
        return ship(spec, on, workers)

    monkeypatch.setattr(launcher, "_ship", stop_rank_1_then_ship)
    with contextlib.ExitStack() as stack:
        on = cluster if memory_limit is None else stack.enter_context(
            gp.Cluster(n_workers=2, memory_limit=memory_limit))
        try:
            started = time.monotonic()
            with pytest.raises(WorkerSilent, match=rf"did not answer within [\d.]+ s when asked "
                                                   rf"for {asked}: a stopped") as info:
                gp.train(_model(small_graph), small_graph, "pipeline", stages=2, chunks=4,
                         epochs=2, cluster=on, timeout=10, progress=False)
            assert time.monotonic() - started < 60  # not forever
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
        victim = next(w for w, pid in on.client.run(os.getpid).items() if pid == stopped[0])
        assert info.value.workers == [victim]
        monkeypatch.setattr(launcher, "_ship", ship)
        again = gp.train(_model(small_graph), small_graph, "pipeline", stages=2, chunks=4,
                         epochs=2, cluster=on, progress=False)
        assert len(again.history) == 2


_DIED_ASKED = (r"worker tcp://[\d.:]+ left the cluster when asked for its resident memory: its "
               "worker process died")


@pytest.mark.parametrize(("phase", "error", "says"), [
    ("_ship", "WorkerLeft", _DIED_ASKED),
    ("_watch", "RankFailure", r"rank 1 failed: its worker process died"),
], ids=["before-its-rank", "at-the-rendezvous"])
def test_a_worker_killed_as_the_ranks_start_fails_the_run_at_once_naming_it(
        cluster, small_graph, monkeypatch, phase, error, says):
    """A worker killed before its rank exists (as the launcher asks what it holds) or as the
    ranks meet (rank 0 waits for it at the rendezvous): the run fails within moments naming
    the worker or the rank, where it had waited out the run's timeout, or raised Dask's bare
    CommClosedError or KeyError."""
    from gnnpipe.runtime import launch as launcher

    real = getattr(launcher, phase)

    def kill(on, address):
        os.kill(on.client.run(os.getpid, workers=[address])[address], signal.SIGKILL)

    def ship(spec, on, workers):
        kill(on, workers[1])
        return real(spec, on, workers)

    def watch(on, workers, futures, prefix):
        kill(on, workers[1])
        return real(on, workers, futures, prefix)

    monkeypatch.setattr(launcher, phase, ship if phase == "_ship" else watch)
    started = time.monotonic()
    with pytest.raises(Exception, match=says) as info:
        gp.train(_model(small_graph), small_graph, "pipeline", stages=2, chunks=4, epochs=2,
                 cluster=cluster, timeout=120, progress=False)
    assert type(info.value).__name__ == error
    assert time.monotonic() - started < 45  # the worker's removal, not the 120 s timeout
    monkeypatch.setattr(launcher, phase, real)
    again = gp.train(_model(small_graph), small_graph, "pipeline", stages=2, chunks=4, epochs=2,
                     cluster=cluster, progress=False)
    assert len(again.history) == 2


@pytest.mark.parametrize(("memory_limit", "says"), [
    (None, "left the cluster when asked for its resident memory"),
    (0, "a worker left while the run's model and graph"),
], ids=["asked-its-memory", "sent-the-graph"])
def test_under_restarts_a_worker_killed_before_its_rank_is_a_restart(
        cluster, small_graph, monkeypatch, tmp_path, memory_limit, says):
    """With ``restarts=1`` a worker killed before the ranks start (as the launcher asks it for
    its memory, or, with no memory_limit, sends it the graph) restarts the run, as a dead rank
    does: it trains, and its events name the worker; the second kill, past its restarts, fails
    the run with WorkerLeft."""
    from gnnpipe.runtime import launch as launcher

    stack = contextlib.ExitStack()  # closes only a cluster of its own: the shared one stays
    on = cluster if memory_limit is None else stack.enter_context(
        gp.Cluster(n_workers=2, memory_limit=memory_limit))

    real, killed, kills = launcher._ship, [], [1]  # kills[0]: the attempts still to kill

    def ship(spec, on, workers):
        if kills[0]:
            kills[0] -= 1
            killed.append(workers[1])
            os.kill(on.client.run(os.getpid, workers=[workers[1]])[workers[1]], signal.SIGKILL)
        return real(spec, on, workers)

    monkeypatch.setattr(launcher, "_ship", ship)
    with stack:
        run = gp.train(_model(small_graph), small_graph, "pipeline", stages=2, chunks=4,
                       epochs=2, cluster=on, checkpoint=tmp_path / "a", restarts=1,
                       timeout=120, progress=False)
        assert len(run.history) == 2 and len(killed) == 1
        (event,) = run.events.to_dict("records")
        assert event["event"] == "restart" and event["epoch"] == 0
        assert event["cause"].startswith(f"{killed[0]} left before the ranks started: ")
        kills[0] = 2
        with pytest.raises(WorkerLeft, match=says):
            gp.train(_model(small_graph), small_graph, "pipeline", stages=2, chunks=4, epochs=2,
                     cluster=on, checkpoint=tmp_path / "b", restarts=1, timeout=120,
                     progress=False)
        assert len(killed) == 3
        assert len(on.ready(on.size or 4)) == (on.size or 4)


def test_a_worker_killed_for_memory_names_its_limit_and_what_needs_less():
    """A pipeline rank that outgrows its worker's Dask memory_limit (the nanny kills the worker
    at 95% of it) fails the run with the limit, and the options that need less per rank."""
    data = gp.datasets.synthetic(num_nodes=100_000, avg_degree=10, num_features=64, seed=0)
    model = gp.models.gcnii(64, hidden=64, out_dim=8, layers=16, dropout=0.0)
    with (gp.Cluster(n_workers=2, memory_limit="900MiB") as capped,
          pytest.raises(RankFailure, match=r"failed: its worker process died") as info):
        gp.train(model, data, "pipeline", stages=2, chunks=8, epochs=20, cluster=capped,
                 timeout=300, progress=False)
    message = str(info.value)
    assert "its worker's Dask memory_limit is 944 MB (the nanny restarts a worker at 95%" in message
    # "of the ... it had" and "fits" once any rank reported what its process held before
    assert re.search(r"gp.estimate_memory puts rank \d's need at [\d.]+ [MG]B( of the "
                     r"[\d.]+ MB it had)? \(the most any rank needs: [\d.]+ [MG]B\); the most "
                     r"any rank needs with one of these: ", message), message
    for option in ("schedule='1f1b'", "recompute=True", "history_dtype=torch.bfloat16",
                   "chunks=16", "stages=3"):
        assert re.search(re.escape(option) + r" \([\d.]+ [MG]B(, fits|, does not fit)?\)",
                         message), message
    # a memory_limit's workers hold only what they use already: no advice to make them
    assert capped.allocator is Allocator.LEAN and "allocator='lean'" not in message


def test_a_worker_killed_receiving_the_graph_names_its_limit_and_what_it_held():
    """A graph too large for the workers' memory_limit kills a worker as it arrives (the nanny
    acts at 95%): the run fails naming the worker, what it held before and its limit, not with
    Dask's "Stream is closed"."""
    data = gp.datasets.synthetic(num_nodes=50_000, avg_degree=4, num_features=2500, seed=0)
    model = gp.models.gcn(2500, hidden=16, out_dim=8, layers=2, dropout=0.0)
    with (gp.Cluster(n_workers=2, memory_limit="700MiB") as capped,
          pytest.raises(RuntimeError, match="memory_limit") as info):
        gp.train(model, data, "pipeline", stages=2, chunks=4, epochs=2, cluster=capped,
                 timeout=120, progress=False)
    message = str(info.value)
    if isinstance(info.value, RankFailure):  # killed just after it had acknowledged the graph
        assert "its worker's Dask memory_limit is 734 MB" in message, message
        return
    assert re.search(r"a worker left while the run's model and graph \(480.41 MiB of tensors\) "
                     r"were sent to it: tcp://[\d.:]+ held [\d.]+ MiB of its memory_limit "
                     r"700.00 MiB before they arrived", message), message


def _hold_until(share: float) -> int:
    """On a worker: hold bytes until the process is at ``share`` of its memory_limit."""
    import builtins

    import numpy as np
    from distributed import get_worker

    from gnnpipe.engine.memory import resident_bytes

    worker = get_worker()
    size = int(share * worker.memory_manager.memory_limit) - resident_bytes()
    builtins._gnnpipe_test_ballast = np.ones(max(size, 0), dtype=np.uint8)
    return size


def _statuses(client) -> set[str]:
    return set(client.run(lambda dask_worker: dask_worker.status.name).values())


@pytest.mark.timeout(600)
def test_workers_dask_paused_for_memory_still_profile_and_train(small_graph):
    """Dask pauses a worker past 80% of its memory_limit and then starts no task: a rank or a
    profile task queued on it would wait forever. gnnpipe resumes its workers and keeps them
    running (past the limit the nanny kills the worker instead, which fails the run)."""
    with gp.Cluster(n_workers=2, memory_limit="2GiB") as capped:
        client = capped.client
        client.gather([client.submit(_hold_until, 0.86, workers=[w], pure=False)
                       for w in capped.workers()])
        # Dask signals no event when it pauses a worker: poll the state its memory monitor sets
        # (every 100 ms), up to a deadline
        deadline = time.monotonic() + 60
        while _statuses(client) != {"paused"} and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _statuses(client) == {"paused"}
        planned = gp.plan(_model(small_graph), small_graph, 2, cluster=capped, repeats=1,
                          modes=["pipeline"])
        run = gp.train(_model(small_graph), small_graph, plan=planned, epochs=2,
                       cluster=capped, timeout=120, progress=False)
        assert len(run.history) == 2 and _statuses(client) == {"running"}


def test_a_worker_killed_while_profiling_fails_the_plan_naming_it(small_graph):
    """A profile task pinned to a worker that dies would wait forever for that worker's address
    (its nanny brings it back under a new one): the plan fails soon, naming the worker."""
    with gp.Cluster(n_workers=2, memory_limit="4GiB") as cluster:
        addresses = cluster.workers()
        started = time.monotonic()
        with pytest.raises(RuntimeError, match=r"plan: a worker died while profiling: "
                           r"tcp://[\d.:]+ \(memory_limit 4.00 GiB\)") as info:
            gp.plan(kill_worker(_model(small_graph)), small_graph, 2, cluster=cluster,
                    repeats=1, modes=["pipeline"])
        assert any(a in str(info.value) for a in addresses)
        assert time.monotonic() - started < 120  # the worker's absence, not a timeout


def test_background_run_is_live_and_stops_together(cluster, small_graph):
    run = gp.train(_model(small_graph), small_graph, "hybrid", stages=2, ways=2, chunks=4,
                   epochs=100_000, cluster=cluster, background=True, progress=False)
    assert not run.done
    deadline = time.monotonic() + 120
    while len(run.history) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    first_look = len(run.history)
    assert first_look >= 3
    run.stop()
    try:
        run.wait(timeout=120)
    except TimeoutError:
        cluster.restart()  # free the workers for the tests after this one
        raise
    assert run.done
    epochs = run.history["epoch"].tolist()
    assert epochs == list(range(len(epochs))) and len(epochs) < 100_000
    per_rank = run.timeline.df[run.timeline.df["kind"] == "step"].groupby("rank")["epoch"].max()
    assert per_rank.nunique() == 1 and len(per_rank) == 4  # every rank stopped at the same epoch


@pytest.mark.parametrize("kwargs, match", [
    ({"mode": "pipeline", "stages": 9}, "stages: 9 stages need at least as many blocks"),
    ({"mode": "pipeline", "stages": 2, "chunks": 601}, "chunks: 601 chunks exceed"),
    ({"mode": "hybrid", "stages": 2, "ways": 2, "workers": 3}, "workers: ways x stages = 4 ranks"),
    ({"mode": "hybrid", "stages": 2, "ways": 2, "chunks": 5}, "do not divide into 2 ways"),
    ({"mode": "graph", "parts": 0}, "parts: expected a positive integer"),
    ({"mode": "graph", "parts": 2, "workers": 4}, "workers: parts = 2 ranks"),
    ({"mode": "pipeline", "stages": 2, "cluster": 42}, "cluster: expected None"),
    ({"mode": "pipeline", "stages": 2, "parts_per_chunk": 0}, "parts_per_chunk: expected a positive"),
])
def test_bad_configurations_fail_before_any_worker_starts(small_graph, kwargs, match):
    before = set(_child_pids())
    with pytest.raises((ValueError, TypeError), match=match):
        gp.train(_model(small_graph), small_graph, epochs=1, progress=False, **kwargs)
    assert set(_child_pids()) <= before  # no worker processes were started


def test_too_small_a_cluster_is_rejected(cluster, small_graph):
    with pytest.raises(ValueError, match="cluster: the run needs 6 workers"):
        gp.train(_model(small_graph), small_graph, "hybrid", stages=3, ways=2, chunks=6,
                 epochs=1, cluster=cluster, progress=False)


def test_cuda_on_workers_without_a_gpu_is_rejected_before_ranks_start(cluster, small_graph):
    from gnnpipe.runtime.cluster import gpu_ids

    if any(cluster.client.run(gpu_ids).values()):
        pytest.skip("the workers have GPUs; tests/gpu covers them")
    with pytest.raises(ValueError, match="device: 'cuda' asked, but torch sees no GPU on worker"):
        gp.train(_model(small_graph), small_graph, "pipeline", stages=2, epochs=1,
                 device="cuda", cluster=cluster, progress=False)


def test_rank_device_and_backend_follow_the_device():
    from gnnpipe.core.job import TrainConfig
    from gnnpipe.runtime.cluster import check_gpus, local_ranks
    from gnnpipe.runtime.spec import JobSpec

    fields = {f: None for f in JobSpec.__dataclass_fields__ if f not in ("job", "node_order")}
    cpu = TrainConfig.from_dict({"mode": "pipeline", "stages": 2})
    assert JobSpec(job=cpu, **fields).backend == "gloo"
    cuda = dataclasses.replace(cpu, device="cuda")
    assert JobSpec(job=cuda, **fields).backend == "nccl"
    workers = ["tcp://10.0.0.5:4001", "tcp://10.0.0.6:4001", "tcp://10.0.0.5:4002"]
    assert local_ranks(workers) == [0, 0, 1]
    check_gpus(workers, {workers[0]: ["a", "b"], workers[1]: ["c"], workers[2]: ["a", "b"]})
    check_gpus(workers, {workers[0]: ["a"], workers[1]: ["c"], workers[2]: ["b"]})  # dask-cuda
    with pytest.raises(ValueError, match="device: ranks 0 and 2 would share GPU a"):
        check_gpus(workers, {workers[0]: ["a"], workers[1]: ["c"], workers[2]: ["a"]})
    with pytest.raises(ValueError, match=r"no GPU on worker\(s\) \['tcp://10.0.0.6:4001'\]"):
        check_gpus(workers, {workers[0]: ["a"], workers[1]: [], workers[2]: ["b"]})


def _child_pids() -> list[int]:
    import psutil

    return [p.pid for p in psutil.Process().children(recursive=True)]


@pytest.mark.parametrize("name, hint", [("workers", "n_workers"), ("memory_limt", "memory_limit")])
def test_a_misspelt_cluster_argument_is_named_before_any_process_starts(name, hint):
    """Dask would only report that a worker "failed to start"; gp.Cluster names the argument
    and its closest match, and starts nothing."""
    with pytest.raises(TypeError, match=rf"unknown argument '{name}'.*did you mean '{hint}'"):
        gp.Cluster(**{name: 2})
