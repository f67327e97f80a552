"""Ranks compute in an environment chosen for torch; a user's slow worker set-up is named; every
distributed run reports its parallel efficiency."""

from __future__ import annotations

import logging
import os

import dask
import pytest
import torch
from distributed import Client, LocalCluster
from failing_blocks import check_subnormals

import gnnpipe as gp
from gnnpipe.analysis.efficiency import CLASSES
from gnnpipe.runtime.workerenv import (
    MALLOC_VAR,
    Allocator,
    _initial_environ,
    check_workers,
    inspect_worker,
    transparent_huge_pages,
)


def test_dask_defaults_are_named_then_gnnpipe_workers_are_clean(caplog, small_graph) -> None:
    """A cluster started with Dask's defaults: the pre-run check names the trim threshold and
    the profiler with their cost, and the run still trains. A gp.Cluster started afterwards in
    the same process (whose os.environ that nanny has just changed) has neither."""
    model = gp.models.gcn(small_graph.num_features, hidden=8, out_dim=4, layers=2)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None, silence_logs=logging.CRITICAL) as plain, \
            Client(plain) as client:
        workers = sorted(client.scheduler_info()["workers"])
        found = check_workers(client, workers, threads=1, timeout=60)
        assert set(found) == set(workers)
        assert any(MALLOC_VAR in p and "1.8x slower" in p for p in found[workers[0]])
        assert any("profiler" in p for p in found[workers[0]])
        with caplog.at_level(logging.WARNING, logger="gnnpipe.runtime.workerenv"):
            run = gp.train(model, small_graph, "pipeline", stages=2, chunks=4, epochs=2,
                           cluster=client, progress=False)
        assert len(run.history) == 2
        assert f"{MALLOC_VAR}=65536" in caplog.text
    initial = _initial_environ() or {}
    with gp.Cluster(n_workers=1, threads_per_worker=2) as cluster:
        env = cluster.client.run(inspect_worker)
        (worker,) = env.values()
        assert worker == {"malloc_trim_threshold": None, "profiler": False,
                          "allocator": "huge" if transparent_huge_pages() else "glibc",
                          "torch_threads": worker["torch_threads"], "omp_threads": "2"}
        assert not any(os.environ.get(k) == v and k not in initial
                       for k, v in Allocator.LEAN.environ().items())  # not left here
        assert check_workers(cluster.client, cluster.workers(), threads=2, timeout=60) == {}


def test_a_cluster_starts_its_ranks_with_the_allocator_asked_for(monkeypatch) -> None:
    """``gp.Cluster(allocator=...)`` wins over ``GNNPIPE_ALLOCATOR``; a bad name is refused,
    naming the argument, before any worker starts."""
    monkeypatch.setenv("GNNPIPE_ALLOCATOR", "glibc")
    with pytest.raises(ValueError, match=r"allocator: expected one of \['glibc', 'huge', "
                                         r"'lean'\], got 'jemalloc'"):
        gp.Cluster(n_workers=1, allocator="jemalloc")
    with pytest.raises(ValueError, match="allocator: expected no allocator for a cluster gnnpipe "
                                         "does not start"):
        gp.Cluster(address="tcp://127.0.0.1:1", allocator="lean")
    with gp.Cluster(n_workers=1, allocator="lean") as cluster:
        (worker,) = cluster.client.run(inspect_worker).values()
    assert worker["allocator"] == "lean"


def _exit_worker() -> None:
    import os

    os._exit(1)


def test_a_restarted_worker_keeps_the_rank_environment() -> None:
    """A worker that dies (a failed rank) comes back from its nanny in the same environment:
    Nanny copies Dask's config shallowly, so without RankNanny the profiler switched off inside
    rank_environment was on again after the restart. (Its nanny restarts it: on a loaded
    machine the local cluster would otherwise give up on the slow restart and replace the
    nanny: the next test's path.)"""
    with (dask.config.set({"distributed.deploy.lost-worker-timeout": "600s"}),
          gp.Cluster(n_workers=1, threads_per_worker=2) as cluster):
        client = cluster.client
        (before,) = client.run(inspect_worker).values()
        with pytest.raises(Exception, match="KilledWorker|died"):
            client.submit(_exit_worker, pure=False).result(timeout=120)
        cluster.ready(1)
        (after,) = client.run(inspect_worker).values()
        assert after == before
        assert after["profiler"] is False and after["omp_threads"] == "2"
        assert after["malloc_trim_threshold"] is None


def test_a_worker_the_cluster_starts_later_has_the_rank_environment() -> None:
    """A local cluster that scales back up (after a worker was lost, or a restart took too
    long) creates the new nanny on its event loop, outside any block of this process: it still
    starts its worker in the rank environment (it used to get Dask's defaults)."""
    with gp.Cluster(n_workers=1, threads_per_worker=2) as cluster:
        assert cluster._local is not None
        cluster._local.scale(2)
        cluster.client.wait_for_workers(2, timeout=120)
        found = list(cluster.client.run(inspect_worker).values())
        assert len(found) == 2
        for env in found:
            assert env["profiler"] is False and env["omp_threads"] == "2"
            assert env["malloc_trim_threshold"] is None


@pytest.mark.parametrize(("mode", "kwargs"), [("pipeline", {"stages": 2, "chunks": 8}),
                                              ("graph", {"parts": 2}),
                                              ("hybrid", {"ways": 2, "stages": 2, "chunks": 8})])
def test_distributed_runs_report_efficiency(cluster, small_graph, mode, kwargs) -> None:
    model = gp.models.gcnii(small_graph.num_features, hidden=16, out_dim=4, layers=4)
    run = gp.train(model, small_graph, mode, epochs=3, cluster=cluster, progress=False, **kwargs)
    per_epoch = run.efficiency()
    assert per_epoch["epoch"].tolist() == [0, 1, 2]
    assert run.history["efficiency"].tolist() == per_epoch["efficiency"].tolist()
    assert ((per_epoch["efficiency"] > 0) & (per_epoch["ideal"] > 0)).all()
    shares = per_epoch[[f"{c}_share" for c in CLASSES]].sum(axis=1)
    assert shares.round(9).eq(1.0).all()
    ranks = run.rank_shares()
    assert ranks.index.tolist() == list(range(run.timeline.num_ranks))
    assert ranks["compute"].gt(0).all()
    summary = run.summary().iloc[0]
    assert 0 < summary["parallel_efficiency"] == pytest.approx(
        per_epoch["efficiency"].iloc[1:].median())


def test_release_freed_memory_hands_a_fragmented_heap_back() -> None:
    """Tensors below glibc's mmap threshold live on the heap; freeing every other one leaves
    holes the heap's automatic trim (top only) cannot return. A rank trims before it starts
    counting its peak, so an earlier run's heap does not count as this run's."""
    import torch

    from gnnpipe.engine.memory import release_freed_memory

    def rss() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) * 1024

    warm = torch.ones(2**20)  # 4 MiB: mmapped, and once freed it raises the threshold above it
    del warm
    kept, freed = [], []
    for i in range(64):
        (kept if i % 2 else freed).append(torch.ones(2**20))
    freed.clear()
    before = rss()
    assert release_freed_memory()
    assert before - rss() > 64 * 2**20  # most of the 128 MiB in holes went back
    assert len(kept) == 32


def _ceiling_here() -> int:
    from gnnpipe.runtime.workerenv import heap_ceiling

    found = heap_ceiling()
    return 0 if found is None else found.ceiling


def test_a_ranks_heap_ceiling_is_its_share_of_the_memory_limit(cluster) -> None:
    """A rank in a Dask worker with a ``memory_limit`` hands freed heap back above 80% of it
    (the nanny kills at 95%); outside a worker nothing is trimmed. (That a capped rank trims:
    ``tests/test_benchmarks.py``'s heap-ceiling run counts its trims.)"""
    from gnnpipe.runtime.workerenv import HEAP_CEILING

    assert _ceiling_here() == 0
    client = cluster.client
    workers = cluster.workers()
    assert len(workers) == 4
    ceilings = dict(zip(workers, client.gather([
        client.submit(_ceiling_here, workers=[w], allow_other_workers=False, pure=False)
        for w in workers])))
    limits = cluster.memory_limits(workers)
    assert ceilings == {w: int(HEAP_CEILING * limits[w]) for w in ceilings}
    assert all(limits.values())


def test_ranks_and_one_process_modes_flush_subnormals(cluster, small_graph) -> None:
    """Every mode's epochs flush subnormal floats (x86 arithmetic on them is many times slower:
    a deep stack's vanishing gradients reach them): a block that raises where they survive
    trains in every mode, and raises when called outside an epoch."""
    model = check_subnormals(gp.models.gcn(small_graph.num_features, hidden=8, out_dim=4,
                                           layers=2))
    with pytest.raises(FloatingPointError, match="not flushed"):
        model.blocks[-1](torch.zeros(1, 4), None, None)
    for mode, extra in (("single", {}), ("local", {"stages": 2}),
                        ("pipeline", {"stages": 2, "cluster": cluster}),
                        ("graph", {"parts": 2, "cluster": cluster})):
        run = gp.train(model, small_graph, mode, chunks=4 if mode != "single" else None,
                       epochs=2, progress=False, **extra)
        assert len(run.history) == 2, mode


def test_ranks_allocator_is_chosen_by_gnnpipe_allocator(monkeypatch) -> None:
    """The workers gnnpipe starts use 2 MiB pages (where the kernel has them);
    ``GNNPIPE_ALLOCATOR`` picks glibc's defaults or the lean allocator; a bad name is named."""
    from gnnpipe.runtime.workerenv import _worker_config

    spawn = "distributed.nanny.pre-spawn-environ."
    thp = transparent_huge_pages()
    monkeypatch.delenv("GNNPIPE_ALLOCATOR", raising=False)
    assert (_worker_config(1).get(spawn + "THP_MEM_ALLOC_ENABLE") == "1") == thp
    assert spawn + "MALLOC_MMAP_THRESHOLD_" not in _worker_config(1)
    # workers given a Dask memory_limit hold only what they use (what a plan fitted to it counts)
    assert (_worker_config(1, Allocator.chosen(capped=True))[spawn + "MALLOC_MMAP_THRESHOLD_"]
            == "1048576")
    monkeypatch.setenv("GNNPIPE_ALLOCATOR", "lean")
    assert _worker_config(1)[spawn + "MALLOC_MMAP_THRESHOLD_"] == "1048576"
    monkeypatch.setenv("GNNPIPE_ALLOCATOR", "glibc")
    assert Allocator.chosen().environ() == {} and Allocator.chosen(capped=True).environ() == {}
    assert not any(k.startswith(spawn + "MALLOC_MMAP") or k.endswith("THP_MEM_ALLOC_ENABLE")
                   for k in _worker_config(1))
    monkeypatch.setenv("GNNPIPE_ALLOCATOR", "jemalloc")
    with pytest.raises(ValueError, match="GNNPIPE_ALLOCATOR: expected one of"):
        _worker_config(1)
