"""Dask clusters for gnnpipe: a local one sized to the run, or an existing scheduler."""

from __future__ import annotations

import logging
import socket
import time
from typing import Any

from distributed import Client, LocalCluster, get_worker

logger = logging.getLogger(__name__)


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
    """

    def __init__(self, n_workers: int = 2, threads_per_worker: int = 1, address: str | None = None,
                 host: str = "127.0.0.1", client: Client | None = None, **kwargs: Any) -> None:
        self.threads_per_worker = threads_per_worker
        self.size: int | None = None  # workers a local cluster keeps (its nannies restart them)
        self._local: LocalCluster | None = None
        if client is not None:
            self.client = client
        elif address is not None:
            self.client = Client(address)
        else:
            if n_workers < 1:
                raise ValueError(f"n_workers: expected at least 1 worker, got {n_workers}")
            # Rank errors reach the caller as RankFailure; worker logs at shutdown (heartbeats to a
            # scheduler already closed) would only be noise.
            kwargs.setdefault("silence_logs", logging.CRITICAL)
            self._local = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                                       host=host, dashboard_address=f"{host}:0", **kwargs)
            self.client = Client(self._local)
            self.size = n_workers

    def workers(self) -> list[str]:
        """Addresses of the workers now connected, sorted (rank ``r`` runs on the ``r``-th)."""
        return sorted(self.client.scheduler_info(n_workers=-1)["workers"])

    def ready(self, world: int, timeout: float = 120.0) -> list[str]:
        """The workers, after waiting up to ``timeout`` s for ``world`` of them when this local
        cluster is still bringing back workers restarted after a failure."""
        if self.size is not None and self.size >= world:
            self._await_workers(world, timeout)
        return self.workers()

    def restart(self) -> None:
        """Restart every worker process (frees ranks stuck in a collective after a failure)."""
        self.client.restart(wait_for_workers=False)
        if self.size is not None:
            self._await_workers(self.size, 180.0)

    def _await_workers(self, n: int, timeout: float) -> None:
        """Wait for ``n`` workers of the local cluster, re-creating any it gave up on: a worker
        whose process stays away longer than ``distributed.deploy.lost-worker-timeout`` (a
        killed one restarting slowly on a loaded machine) is dropped for good by ``LocalCluster``
        unless it is scaled back up."""
        deadline = time.monotonic() + timeout
        while len(self.workers()) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                logger.warning("only %d of %d workers came back", len(self.workers()), n)
                return
            self._local.scale(self.size)  # type: ignore[union-attr]
            try:
                self.client.wait_for_workers(n, timeout=min(left, 10.0))
            except TimeoutError:
                continue

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
        return f"Cluster({kind}, scheduler={self.client.scheduler.address}, workers={len(self.workers())})"


def resolve(cluster: Cluster | Client | str | None, world: int) -> tuple[Cluster, bool]:
    """Turn ``train``'s ``cluster`` argument into a :class:`Cluster`; True when we own it."""
    if cluster is None:
        return Cluster(n_workers=world), True
    if isinstance(cluster, Cluster):
        return cluster, False
    if isinstance(cluster, Client):
        return Cluster(client=cluster), False
    if isinstance(cluster, str):
        return Cluster(address=cluster), True
    raise TypeError(f"cluster: expected None, gp.Cluster, distributed.Client or a scheduler "
                    f"address, got {type(cluster).__name__}")


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
    """Run on rank 0's worker: its host and a free TCP port for the process-group rendezvous."""
    host = get_worker().address.split("://")[-1].rsplit(":", 1)[0]
    with socket.socket() as s:
        s.bind((host, 0))
        return host, s.getsockname()[1]
