"""Calls on workers that give up: a worker that stops answering (a stopped, swapping or wedged
process) fails the call naming it, where Dask would wait for it forever.

Before a run's ranks exist nothing else watches the workers: the launcher asks them for a free
port, their resident memory and their environment, and sends them the model and graph. Each of
those calls is bounded here; past its bound every worker that does not answer a ping is named.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from distributed import Client, Future
from torch import Tensor

__all__ = ["ANSWER_S", "PING_S", "WorkerSilent", "ask", "graph_bytes", "result_within",
           "scatter_within", "silent"]

#: What a call past its bound raises (asyncio's is the built-in one from Python 3.11 only).
_TIMEOUTS = (TimeoutError, asyncio.TimeoutError)

#: Seconds a worker has to answer where no run's ``timeout`` applies (profiling for a plan).
ANSWER_S = 120.0
#: Seconds a worker has to answer a ping once a call on it timed out (naming the silent ones).
PING_S = 5.0
#: Bytes a worker receives per second at the least when the launcher sends it the graph (the
#: scatter's bound is the run's ``timeout`` plus the graph's size at this rate).
SLOWEST_RECEIVE = 10e6


class WorkerSilent(TimeoutError):
    """``workers`` did not answer ``what`` within ``timeout`` seconds."""

    def __init__(self, workers: list[str], what: str, timeout: float) -> None:
        names = ", ".join(workers)
        super().__init__(
            f"cluster: worker{'s' if len(workers) > 1 else ''} {names} did not answer within "
            f"{timeout:g} s when asked for {what}: a stopped, swapping or overloaded process "
            f"(the run's timeout= sets how long the launcher waits)")
        self.workers, self.what, self.timeout = workers, what, timeout


def _pong() -> bool:
    return True


def silent(client: Client, workers: list[str]) -> list[str]:
    """Those of ``workers`` that do not answer a ping within :data:`PING_S` seconds (all of
    them if each one answers: then they were slow, not silent)."""
    quiet = []
    for worker in workers:
        try:
            client.run(_pong, workers=[worker], callback_timeout=PING_S)
        except _TIMEOUTS:
            quiet.append(worker)
    return quiet or list(workers)


def ask(client: Client, function: Callable[..., Any], workers: list[str], *args: Any,
        timeout: float, what: str) -> dict[str, Any]:
    """``client.run(function, *args)`` on ``workers``, each answer by worker address; raise
    :class:`WorkerSilent` naming the silent workers after ``timeout`` seconds."""
    try:
        return dict(client.run(function, *args, workers=workers, callback_timeout=timeout))
    except _TIMEOUTS as exc:
        raise WorkerSilent(silent(client, workers), what, timeout) from exc


def result_within(client: Client, future: Future, worker: str, timeout: float,
                  what: str) -> Any:
    """``future``'s result (a task pinned to ``worker``) within ``timeout`` seconds."""
    try:
        return future.result(timeout=timeout)
    except _TIMEOUTS as exc:
        client.cancel([future])
        raise WorkerSilent(silent(client, [worker]), what, timeout) from exc


def graph_bytes(data: Any) -> int:
    """Bytes of a graph's tensors (a PyG ``Data``)."""
    return sum(v.numel() * v.element_size() for _, v in data if isinstance(v, Tensor))


def scatter_within(client: Client, value: Any, workers: list[str], size: int, timeout: float,
                   what: str) -> Future:
    """``value`` (``size`` bytes) sent to every one of ``workers``, within ``timeout`` seconds
    plus its size at :data:`SLOWEST_RECEIVE`.

    A send past its bound goes on in the scheduler: once the silent worker answers again, a
    copy of ``value`` lands on the workers and stays there while this client is connected (no
    future holds it, so nothing releases it; restarting the workers frees it)."""
    bound = timeout + size / SLOWEST_RECEIVE
    try:  # Client.scatter's own timeout= bounds only the wait for workers, not the sending
        return client.sync(client._scatter, value, workers=workers, broadcast=True, hash=False,
                           timeout=bound, callback_timeout=bound)
    except _TIMEOUTS as exc:
        raise WorkerSilent(silent(client, workers), what, bound) from exc
