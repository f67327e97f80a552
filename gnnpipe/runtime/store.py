"""The process group's sockets, bound where the Dask cluster binds, never on every interface.

torch's ``tcp://`` rendezvous starts a c10d ``TCPStore`` server listening on ``*:PORT`` for the
whole run (unauthenticated), and gloo picks its interface from the host name. Here rank 0 binds
the store's listening socket itself, on its worker's address only, and hands it to ``TCPStore``
(``master_listen_fd``, honoured by both the libuv and the legacy server); gloo and NCCL are told
the interface that holds the worker's address.
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta

import torch.distributed as dist

__all__ = ["address_host", "bind_transport", "interface_of", "rendezvous", "worker_host"]

logger = logging.getLogger(__name__)

#: The variable naming each backend's interface, and how its value is spelt (``=`` makes NCCL
#: match the name exactly rather than as a prefix).
_IFNAME = {"gloo": ("GLOO_SOCKET_IFNAME", "{}"), "nccl": ("NCCL_SOCKET_IFNAME", "={}")}


def address_host(address: str) -> str:
    """The host of a Dask address: ``tcp://10.0.0.5:4000`` -> ``10.0.0.5``, ``tcp://[::1]:1`` -> ``::1``."""
    return address.split("://")[-1].rsplit(":", 1)[0].strip("[]")


def worker_host() -> str | None:
    """The host of this Dask worker's address, or None outside a worker."""
    try:
        from distributed import get_worker

        return address_host(get_worker().address)
    except ValueError:
        return None


def interface_of(host: str) -> str | None:
    """The name of the network interface holding ``host``'s address (``lo`` for 127.0.0.1)."""
    import psutil  # a dependency of distributed

    try:
        ips = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except socket.gaierror:
        return None
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] in ips for a in addrs
               if a.family in (socket.AF_INET, socket.AF_INET6)):
            return name
    return None


def bind_transport(backend: str, host: str) -> None:
    """Make ``backend``'s own connections use the interface of ``host`` (this worker's address),
    unless the user already chose one with the backend's variable."""
    var, spelling = _IFNAME[backend]
    if var in os.environ:
        return
    iface = interface_of(host)
    if iface is None:
        logger.warning("no interface holds %s; %s picks its own", host, backend)
        return
    os.environ[var] = spelling.format(iface)


def rendezvous(init_method: str, rank: int, world: int, timeout: timedelta) -> dist.TCPStore:
    """The ``TCPStore`` of ``init_method`` (``tcp://host:port``, host being rank 0's worker):
    rank 0 serves it on ``host`` only, the other ranks connect to it."""
    host, port = address_host(init_method), int(init_method.rsplit(":", 1)[1])
    if rank != 0:
        return dist.TCPStore(host, port, world, False, timeout)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.create_server((host, port), family=family, backlog=max(world, 16))
    # The server takes the descriptor over (and closes it with the store).
    return dist.TCPStore(host, port, world, True, timeout, master_listen_fd=listener.detach())
