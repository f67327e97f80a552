"""What a message between two ranks costs on a cluster, measured the way ranks exchange tensors:
two workers join a gloo process group and swap tensors (an ``isend`` and an ``irecv`` each, then
both waited for, as a graph-parallel rank swaps halo rows), small ones for the latency of a round
and large ones for the bandwidth."""

from __future__ import annotations

import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from gnnpipe.runtime.asking import result_within
from gnnpipe.runtime.cluster import Cluster, free_port
from gnnpipe.runtime.store import bind_transport, rendezvous, worker_host

__all__ = ["LARGE_VALUES", "measure_link"]

#: float32 values of the large message (4 MiB).
LARGE_VALUES = 1 << 20
_SMALL_ROUNDS, _LARGE_ROUNDS = 30, 6


def measure_link(cluster: Cluster, timeout: float = 60.0) -> tuple[float, float] | None:
    """``(latency seconds, bandwidth bytes/s)`` of a swap between the cluster's first two
    workers, or None for a cluster of one worker."""
    workers = cluster.ready(2, timeout)[:2]
    if len(workers) < 2:
        return None
    client = cluster.client
    cluster.keep_running(workers, timeout)
    host, port = result_within(client, client.submit(free_port, workers=[workers[0]], pure=False),
                               workers[0], timeout, "a free port for the link's measurement")
    futures = [client.submit(_swap_times, f"tcp://{host}:{port}", rank, timeout, workers=[w],
                             allow_other_workers=False, pure=False)
               for rank, w in enumerate(workers)]
    small, large = cluster.gather_pinned(futures, workers)[0]
    return small, LARGE_VALUES * 4 / max(large - small, 1e-9)


def _swap_times(init_method: str, rank: int, timeout: float) -> tuple[float, float]:
    """Run on a worker: median seconds of a swap of one value and of :data:`LARGE_VALUES`."""
    host = worker_host()
    if host is not None:
        bind_transport("gloo", host)
    wait = timedelta(seconds=timeout)
    store = rendezvous(init_method, rank, 2, wait)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=wait)
    try:
        peer = 1 - rank

        def swap(values: int, rounds: int) -> float:
            sent, got = torch.ones(values), torch.empty(values)
            took = []
            for _ in range(rounds + 1):  # the first round sets the connection up
                dist.barrier()
                began = time.perf_counter()
                works = [dist.isend(sent, peer), dist.irecv(got, peer)]
                for work in works:
                    if work is not None:
                        work.wait()
                took.append(time.perf_counter() - began)
            return statistics.median(took[1:])

        return swap(1, _SMALL_ROUNDS), swap(LARGE_VALUES, _LARGE_ROUNDS)
    finally:
        dist.destroy_process_group()
