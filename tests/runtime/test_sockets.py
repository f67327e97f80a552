"""Nothing listens where it should not: while a run trains, every socket the client, scheduler,
nannies and workers listen on (the rendezvous store and gloo's transport included) is on the
loopback interface the cluster was started on."""

from __future__ import annotations

import ipaddress
import os
import time

import psutil

import gnnpipe as gp
from gnnpipe.runtime.store import interface_of


def _store_port() -> int | None:
    """Run on a worker: the port of this process's rendezvous store, if it is in a run."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return None
    store = dist.distributed_c10d._get_default_store()
    while hasattr(store, "underlying_store"):  # PrefixStore wrappers
        store = store.underlying_store
    return store.port


def _gloo_ifname() -> str | None:
    """Run on a worker: the interface its gloo transport was told to use."""
    return os.environ.get("GLOO_SOCKET_IFNAME")


def _listeners(pid: int) -> set[tuple[str, int]]:
    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN}


def test_every_listener_of_a_training_run_is_on_loopback(cluster, small_graph):
    model = gp.models.gcn(small_graph.num_features, hidden=8, out_dim=4, layers=4)
    run = gp.train(model, small_graph, "pipeline", stages=2, chunks=4, epochs=100_000,
                   cluster=cluster, timeout=300, background=True, progress=False)
    try:
        deadline = time.monotonic() + 120
        while len(run.history) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(run.history) >= 2 and not run.done
        client = cluster.client
        workers = client.run(os.getpid)
        store_ports = client.run(_store_port)
        ports = {p for p in store_ports.values() if p is not None}
        ranks = [w for w, p in store_ports.items() if p is not None]
        ifnames = client.run(_gloo_ifname, workers=ranks)
        pids = {os.getpid(), client.run_on_scheduler(os.getpid), *workers.values()}
        pids |= {psutil.Process(pid).ppid() for pid in workers.values()}  # the nannies
        listening = {pid: _listeners(pid) for pid in pids}
    finally:
        run.stop()
        run.wait(timeout=120)
    assert len(ports) == 1, f"expected one rendezvous store among the ranks, found {ports}"
    loopback = interface_of("127.0.0.1")
    assert loopback is not None and set(ifnames.values()) == {loopback}, ifnames  # gloo's own
    found = {addr for addrs in listening.values() for addr in addrs}
    assert ports & {port for _, port in found}, f"store port {ports} not among listeners {found}"
    exposed = {pid: sorted(a for a in addrs if not ipaddress.ip_address(a[0]).is_loopback)
               for pid, addrs in listening.items()}
    assert not any(exposed.values()), f"listening beyond loopback: {exposed}"
