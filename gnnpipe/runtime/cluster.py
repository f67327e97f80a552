"""Dask clusters for gnnpipe: a local one sized to the run, or an existing scheduler."""

from __future__ import annotations

import difflib
import inspect
import logging
import socket
import time
from typing import Any

from distributed import Client, Future, LocalCluster, Nanny, Worker, get_worker, wait
from distributed.core import PooledRPCCall, Server, Status, rpc

from gnnpipe.runtime.asking import ask, present, why_left
from gnnpipe.runtime.scripts import check_main_guard
from gnnpipe.runtime.workerenv import Allocator, RankNanny, rank_environment, worker_environ

__all__ = ["PRELOAD", "Absence", "Cluster", "WorkerLost", "check_cluster", "check_gpus", "free_port", "gpu_ids", "local_ranks",
           "resolve"]

logger = logging.getLogger(__name__)


def _named_parameters(cls: type[Any]) -> set[str]:
    return {name for name, p in inspect.signature(cls.__init__).parameters.items()
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and name != "self"}


def _check_cluster_kwargs(kwargs: dict[str, Any]) -> None:
    """Refuse, before any process starts, a keyword that neither ``LocalCluster`` nor its
    workers take (Dask would report only that a worker "failed to start")."""
    known = {"n_workers", "threads_per_worker", "address", "host", "client"}.union(
        *(_named_parameters(c) for c in (LocalCluster, Nanny, Worker, Server)))
    for name in kwargs:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"Cluster: unknown argument {name!r} (expected an argument of "
                            f"gp.Cluster, distributed.LocalCluster or its workers){hint}")


#: Modules every worker of a local cluster imports as it starts (torch, PyG, gnnpipe's rank and
#: profiling code: about 4 s of CPU each on a 2-core machine), so that a plan's profile or a run's
#: first task on a cluster already running does not wait for them.
PRELOAD = ("gnnpipe.runtime.rank", "gnnpipe.plan.profile")

#: Seconds a worker that tasks are pinned to may be absent from the scheduler before it counts
#: as lost (a restarted worker comes back under a new address, so the tasks would never run).
GONE_AFTER_S = 10.0


class WorkerLost(RuntimeError):
    """The worker at ``address`` (Dask ``memory_limit`` ``memory_limit`` bytes, 0: none) left
    the scheduler while tasks pinned to it were waiting or running."""

    def __init__(self, address: str, memory_limit: int = 0) -> None:
        super().__init__(f"worker {address} left the cluster while running gnnpipe tasks")
        self.address, self.memory_limit = address, memory_limit


class Cluster:
    """One Dask worker process per rank.

    Args:
        n_workers: worker processes of a new local cluster (ignored with ``address``).
        threads_per_worker: torch threads each rank uses (Dask's nanny sets OMP_NUM_THREADS=1,
            so ranks call ``torch.set_num_threads`` with this).
        address: connect to this scheduler (``tcp://host:8786``) instead of starting one; start
            it with ``dask scheduler`` and one ``dask worker ADDRESS --nthreads 1`` per rank and host.
        host: interface a new local cluster binds to (localhost by default).
        client: use this existing ``distributed.Client``.
        allocator: how the ranks of a new local cluster allocate CPU memory, an
            :class:`~gnnpipe.runtime.workerenv.Allocator` name: ``"lean"`` (a rank holds what it
            uses, at some speed), ``"huge"`` or ``"glibc"`` (default: ``GNNPIPE_ALLOCATOR``, or
            ``"lean"`` for workers given a ``memory_limit`` and ``"huge"`` for others).
        **kwargs: arguments of ``distributed.LocalCluster`` and its workers (a new local cluster
            only); its workers import :data:`PRELOAD` as they start, and any ``preload`` given.
    """

    def __init__(self, n_workers: int = 2, threads_per_worker: int = 1, address: str | None = None,
                 host: str = "127.0.0.1", client: Client | None = None,
                 allocator: Allocator | str | None = None, **kwargs: Any) -> None:
        self.threads_per_worker = threads_per_worker
        self.size: int | None = None  # workers a local cluster keeps (its nannies restart them)
        self._local: LocalCluster | None = None
        self._allocator: Allocator | None = None  # a local cluster's workers'
        if allocator is not None and (client is not None or address is not None):
            raise ValueError(f"allocator: expected no allocator for a cluster gnnpipe does not "
                             f"start (address= or client=), got {allocator!r}")
        if client is not None:
            self.client = client
        elif address is not None:
            self.client = Client(address)
        else:
            if n_workers < 1:
                raise ValueError(f"n_workers: expected at least 1 worker, got {n_workers}")
            _check_cluster_kwargs(kwargs)
            check_main_guard()  # spawned workers re-import the script: refuse unguarded calls
            # Rank errors reach the caller as RankFailure; worker logs at shutdown (heartbeats to a
            # scheduler already closed) would only be noise.
            kwargs.setdefault("silence_logs", logging.CRITICAL)
            given = kwargs.pop("preload", None) or []
            kwargs["preload"] = [*PRELOAD, *([given] if isinstance(given, str) else given)]
            # full-speed torch in every rank; ranks hold what they use under a memory_limit
            self._allocator = _allocator(allocator, kwargs.get("memory_limit"))
            with rank_environment(threads_per_worker, self._allocator):
                self._local = LocalCluster(
                    n_workers=n_workers, threads_per_worker=1, processes=True, host=host,
                    worker_class=RankNanny, dashboard_address=f"{host}:0", **kwargs,
                    rank_environ=worker_environ(threads_per_worker, self._allocator))
            self.client = Client(self._local)
            self.size = n_workers

    @property
    def allocator(self) -> Allocator | None:
        """The :class:`~gnnpipe.runtime.workerenv.Allocator` of the workers this cluster
        started (None: one it connected to, whose workers it did not start)."""
        return self._allocator

    def _scheduler(self) -> rpc | PooledRPCCall:
        """The client's handle on the scheduler (which a closed client no longer has)."""
        if self.client.scheduler is None:
            raise RuntimeError("Cluster: its client is closed")
        return self.client.scheduler

    def workers(self) -> list[str]:
        """Addresses of the workers now connected, sorted (a run takes those free of other
        gnnpipe runs, idle ones first, in this order; see
        :func:`~gnnpipe.runtime.asking.present`)."""
        return present(self.client)

    def keep_running(self, workers: list[str], timeout: float) -> None:
        """Stop Dask from pausing ``workers`` and resume any it paused, before gnnpipe queues
        tasks on them (see :func:`_never_pause`); each must answer within ``timeout`` s."""
        ask(self.client, _never_pause, workers, timeout=timeout,
            what="its go-ahead to run gnnpipe tasks")

    def gather_pinned(self, futures: list[Future], workers: list[str]) -> list[Any]:
        """The results of ``futures``, each pinned to one of ``workers``; :class:`WorkerLost`
        (the pending futures cancelled) when the scheduler removed one of ``workers``, or it has
        been gone for :data:`GONE_AFTER_S`: Dask would keep a task pinned to a dead worker's
        address waiting forever, since its nanny brings the worker back under a new address."""
        limits, absence = self.memory_limits(workers), Absence(self, workers)
        pending = list(futures)
        while pending and not any(f.status == "error" for f in futures):
            try:
                wait(pending, timeout=0.5, return_when="FIRST_COMPLETED")
            except TimeoutError:
                pass
            pending = [f for f in futures if not f.done()]
            lost = [w for w, gone in absence.seconds().items()
                    if gone >= GONE_AFTER_S or (gone and absence.removed(w))]
            if lost:
                self.client.cancel(pending)
                raise WorkerLost(lost[0], limits.get(lost[0], 0))
        return self.client.gather(futures)

    def memory_limits(self, workers: list[str]) -> dict[str, int]:
        """Each of ``workers``' Dask ``memory_limit`` in bytes (0: none), asked of the scheduler
        while they are alive (a worker killed for memory is gone from it afterwards)."""
        info = self.client.sync(self._scheduler().identity, n_workers=-1)["workers"]
        return {w: int(info[w].get("memory_limit") or 0) for w in workers if w in info}

    def ready(self, world: int, timeout: float = 120.0) -> list[str]:
        """The workers, after waiting up to ``timeout`` s for ``world`` of them: a local cluster
        may still be bringing back workers restarted after a failure, a remote one may still be
        starting or restarting its workers. A local cluster smaller than ``world`` is not
        waited for (it never grows)."""
        if self.size is None or self.size >= world:
            self._await_workers(world, timeout)
        return self.workers()

    def require(self, world: int, timeout: float) -> list[str]:
        """:meth:`ready`, or a ``ValueError`` naming how many workers there were after how long
        when fewer than ``world`` (one per rank) are connected by then."""
        started = time.monotonic()
        workers = self.ready(world, timeout)
        if len(workers) >= world:
            return workers
        if self.size is not None and self.size < world:
            found = f"the local cluster has {self.size}"  # never waited for: it never grows
        else:
            waited = time.monotonic() - started
            found = (f"the cluster has {len(workers)} after waiting {waited:.0f} s "
                     f"(timeout={timeout:g} s)")
        raise ValueError(f"cluster: the run needs {world} workers (one per rank), {found}")

    def restart(self, workers: list[str] | None = None) -> None:
        """Restart ``workers`` only (frees a failed run's ranks stuck in a collective, leaving
        other runs and clients alone), or every worker, cancelling all tasks, when None."""
        if workers is None:
            self.client.restart(wait_for_workers=False)
        else:
            self.client.restart_workers(workers, timeout=120, raise_for_error=False)
        if self.size is not None and not self._await_workers(self.size, 180.0):
            logger.warning("only %d of %d workers came back", len(self.workers()), self.size)

    def _await_workers(self, n: int, timeout: float) -> bool:
        """Wait up to ``timeout`` s for ``n`` workers (True once they are there). A local
        cluster re-creates any worker it gave up on: one whose process stays away longer than
        ``distributed.deploy.lost-worker-timeout`` (a killed one restarting slowly on a loaded
        machine) is dropped for good by ``LocalCluster`` unless it is scaled back up."""
        deadline = time.monotonic() + timeout
        logged = False
        while (found := len(self.workers())) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if not logged:
                logger.info("waiting up to %.0f s for %d workers, %d are connected", left, n,
                            found)
                logged = True
            if self._local is not None:
                with rank_environment(self.threads_per_worker, self._allocator):
                    self._local.scale(self.size)
            try:
                self.client.wait_for_workers(n, timeout=min(left, 10.0))
            except TimeoutError:
                continue
        return True

    def close(self) -> None:
        self.client.close()
        if self._local is not None:
            self._local.close()

    def __enter__(self) -> Cluster:  # noqa: PYI034 - typing.Self needs Python 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = "local" if self._local is not None else "remote"
        return f"Cluster({kind}, scheduler={self._scheduler().address}, workers={len(self.workers())})"


def _allocator(given: Allocator | str | None, memory_limit: Any) -> Allocator:
    """``Cluster``'s ``allocator`` argument as an :class:`Allocator` (:meth:`Allocator.chosen`
    when None: ``lean`` for workers given a Dask ``memory_limit``)."""
    if given is None:
        return Allocator.chosen(capped=memory_limit not in (None, 0, "0", "auto"))
    try:
        return Allocator(given)
    except ValueError:
        raise ValueError(f"allocator: expected one of {[a.value for a in Allocator]}, "
                         f"got {given!r}") from None


#: Seconds to reach a scheduler given by address: the TCP probe, then the Client's handshake.
PROBE_TIMEOUT, CONNECT_TIMEOUT = 3.0, 10.0


def check_cluster(cluster: Any) -> None:
    """Refuse a ``cluster`` argument that cannot run anything, without starting a worker: the
    wrong type, a closed :class:`Cluster` or ``Client``, or an address where nothing answers
    (a plain TCP connect, :data:`PROBE_TIMEOUT` s)."""
    from distributed.comm.addressing import parse_address, parse_host_port

    if cluster is None:
        return
    if isinstance(cluster, (Cluster, Client)):
        client = cluster.client if isinstance(cluster, Cluster) else cluster
        if client.status in ("closing", "closed"):
            raise ValueError(f"cluster: the {type(cluster).__name__} given is closed; "
                             "pass an open one, or None for a new local cluster")
        return
    if not isinstance(cluster, str):
        raise TypeError(f"cluster: expected None, gp.Cluster, distributed.Client or a scheduler "
                        f"address, got {type(cluster).__name__}")
    scheme, location = parse_address(cluster.strip())
    if scheme in ("inproc", "ucx"):
        return  # nothing a TCP probe could check
    try:
        if scheme not in ("tcp", "tls", "ws", "wss"):
            raise ValueError(scheme)
        host, port = parse_host_port(location)
    except ValueError:
        raise ValueError(f"cluster: expected a scheduler address such as 'tcp://host:8786', "
                         f"got {cluster!r}") from None
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT).close()
    except OSError as err:
        raise ValueError(f"cluster: nothing answers at {scheme}://{host}:{port} ({err}); start "
                         f"a scheduler there, or pass cluster=None for a local one") from None


def resolve(cluster: Cluster | Client | str | None, world: int) -> tuple[Cluster, bool]:
    """Turn ``train``'s ``cluster`` argument into a :class:`Cluster`; True when we own it.
    Refuses what :func:`check_cluster` refuses before any connection or worker."""
    check_cluster(cluster)
    if cluster is None:
        return Cluster(n_workers=world), True
    if isinstance(cluster, Cluster):
        return cluster, False
    if isinstance(cluster, Client):
        return Cluster(client=cluster), False
    try:
        client = Client(cluster, timeout=CONNECT_TIMEOUT)
    except OSError as err:  # it accepts TCP but no Dask scheduler answers in time
        raise ValueError(f"cluster: no Dask scheduler answers at {cluster} ({err})") from None
    return Cluster(client=client), True


def gpu_ids() -> list[str]:
    """Run on a worker: the UUIDs of the GPUs torch sees there, in device order."""
    import torch

    return [str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())]


def local_ranks(workers: list[str]) -> list[int]:
    """Each rank's place among the ranks on its host (``workers``: addresses in rank order)."""
    hosts = [w.split("://")[-1].rsplit(":", 1)[0] for w in workers]
    return [hosts[:r].count(host) for r, host in enumerate(hosts)]


def check_gpus(workers: list[str], ids: dict[str, list[str]]) -> None:
    """Each rank takes GPU ``local rank mod GPUs seen``; NCCL needs a different one per rank."""
    if without := [w for w in workers if not ids.get(w)]:
        raise ValueError(f"device: 'cuda' asked, but torch sees no GPU on worker(s) {without}")
    taken: dict[str, int] = {}
    for rank, (worker, local) in enumerate(zip(workers, local_ranks(workers))):
        gpu = ids[worker][local % len(ids[worker])]
        if gpu in taken:
            raise ValueError(f"device: ranks {taken[gpu]} and {rank} would share GPU {gpu}; NCCL "
                             "needs one GPU per rank (more GPUs, or fewer ranks)")
        taken[gpu] = rank


def free_port() -> tuple[str, int]:
    """Run on rank 0's worker: its host and a free TCP port there for the process-group
    rendezvous (rank 0 then serves it on that host only: :func:`gnnpipe.runtime.store.rendezvous`)."""
    from gnnpipe.runtime.store import address_host

    host = address_host(get_worker().address)
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return host, s.getsockname()[1]


def _never_pause(dask_worker: Worker) -> None:
    """Turn off Dask's pause (``distributed.worker.memory.pause``, 80% of ``memory_limit``) on
    this worker and resume it if paused. A paused worker starts no task, so a rank or profile
    task queued on it would wait forever; a gnnpipe task needs the memory it holds, and past
    the limit the nanny kills the worker, which fails the run naming the limit."""
    dask_worker.memory_manager.memory_pause_fraction = False
    if dask_worker.status == Status.paused:
        dask_worker.status = Status.running


class Absence:
    """How long each of ``workers`` has been missing from ``cluster``'s scheduler (a dead
    worker's nanny brings it back under a new address, so work pinned to it never runs)."""

    def __init__(self, cluster: Cluster, workers: list[str]) -> None:
        self.cluster, self.workers = cluster, workers
        self._since: dict[str, float] = {}
        self._why: dict[str, str] = {}

    def seconds(self) -> dict[str, float]:
        """Seconds each worker has been absent, asked of the scheduler now (0: present)."""
        alive, now = set(self.cluster.workers()), time.monotonic()
        for w in self.workers:
            if w in alive:
                self._since.pop(w, None)
            else:
                self._since.setdefault(w, now)
        return {w: now - self._since.get(w, now) for w in self.workers}

    def removed(self, worker: str) -> str | None:
        """Why the scheduler removed ``worker`` (see :func:`~gnnpipe.runtime.asking.why_left`),
        if it is absent and the scheduler says it removed it: gone for good (the scheduler
        closes a worker it removes), so work pinned to it never runs."""
        if worker not in self._why and worker in self._since:
            why = why_left(self.cluster.client, worker)
            if why is not None:
                self._why[worker] = why
        return self._why.get(worker)
