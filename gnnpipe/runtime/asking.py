"""Calls on workers that give up: a worker that stops answering (a stopped, swapping or wedged
process) fails the call naming it, where Dask would wait for it forever.

Before a run's ranks exist nothing else watches the workers: the launcher asks them for a free
port, their resident memory and their environment, and sends them the model and graph. Each of
those calls is bounded here; past its bound every worker that does not answer a ping is named.
A worker that leaves the cluster meanwhile (its process killed, or closed by the scheduler) fails
the call at once, naming it and why the scheduler removed it: Dask would wait for a dead
worker's address until the bound, or answer with a bare ``CommClosedError`` or ``KeyError``.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from distributed import Client, Future
from torch import Tensor

__all__ = ["ANSWER_S", "PING_S", "WorkerLeft", "WorkerSilent", "ask", "graph_bytes", "left",
           "present", "result_within", "scatter_within", "silent", "why_left"]

#: What a call past its bound raises (asyncio's is the built-in one from Python 3.11 only).
_TIMEOUTS = (TimeoutError, asyncio.TimeoutError)

#: Seconds a worker has to answer where no run's ``timeout`` applies (profiling for a plan).
ANSWER_S = 120.0
#: Seconds a worker has to answer a ping once a call on it timed out (naming the silent ones).
PING_S = 5.0
#: Bytes a worker receives per second at the least when the launcher sends it the graph (the
#: scatter's bound is the run's ``timeout`` plus the graph's size at this rate).
SLOWEST_RECEIVE = 10e6
#: Seconds between two looks at the scheduler's workers while a call is under way.
WATCH_S = 0.25
#: Seconds a call that failed on a broken connection waits for the scheduler to remove the
#: worker behind it (it notices a dead worker within moments).
NOTICE_S = 5.0
#: Why the scheduler removed a worker, by its removal's ``stimulus_id`` prefix (its events).
_REMOVED = {"handle-worker-cleanup": "its worker process died",
            "check-worker-ttl": "its worker stopped answering the scheduler (missed heartbeats)",
            "retire-workers": "its worker was retired"}


class WorkerSilent(TimeoutError):
    """``workers`` did not answer ``what`` within ``timeout`` seconds."""

    def __init__(self, workers: list[str], what: str, timeout: float) -> None:
        names = ", ".join(workers)
        super().__init__(
            f"cluster: worker{'s' if len(workers) > 1 else ''} {names} did not answer within "
            f"{timeout:g} s when asked for {what}: a stopped, swapping or overloaded process "
            f"(the run's timeout= sets how long the launcher waits)")
        self.workers, self.what, self.timeout = workers, what, timeout


class WorkerLeft(RuntimeError):
    """``workers`` left the cluster while asked for ``what``; ``why``: the scheduler's reason
    for the first one (see :func:`why_left`); ``message``: the error's text (default: those
    three, and that the nanny brings a worker back)."""

    def __init__(self, workers: list[str], what: str, why: str,
                 message: str | None = None) -> None:
        names = ", ".join(workers)
        super().__init__(message or (
            f"cluster: worker{'s' if len(workers) > 1 else ''} {names} left the cluster when "
            f"asked for {what}: {why} (a worker's nanny brings it back under a new address; "
            "run again)"))
        self.workers, self.what, self.why = workers, what, why


def present(client: Client) -> list[str]:
    """Addresses of the workers the scheduler lists now, sorted.

    Asked of the scheduler itself: ``Client.scheduler_info()`` returns the client's cached
    identity, which its periodic refresh (``distributed.client.scheduler-info-interval``)
    overwrites with one listing no workers, so it could read 0 workers on a full cluster."""
    if client.scheduler is None:
        raise RuntimeError("Cluster: its client is closed")
    return sorted(client.sync(client.scheduler.identity, n_workers=-1)["workers"])


def left(client: Client, workers: list[str]) -> list[str]:
    """Those of ``workers`` the scheduler no longer lists."""
    listed = set(present(client))
    return [w for w in workers if w not in listed]


def why_left(client: Client, worker: str) -> str | None:
    """Why the scheduler removed ``worker``, from its events (its last ``remove-worker``; None
    if it has not)."""
    for _, event in reversed(client.get_events(worker)):
        if isinstance(event, dict) and event.get("action") == "remove-worker":
            stimulus = str(event.get("stimulus_id", ""))
            return next((why for key, why in _REMOVED.items() if stimulus.startswith(key)),
                        f"the scheduler removed its worker ({stimulus.rsplit('-', 1)[0]})")
    return None


def _left(client: Client, workers: list[str], what: str) -> WorkerLeft | None:
    """:class:`WorkerLeft` for those of ``workers`` gone from the cluster (None: none is)."""
    gone = left(client, workers)
    return WorkerLeft(gone, what, why_left(client, gone[0]) or "its worker left the scheduler"
                      ) if gone else None


def _noticed(client: Client, workers: list[str], what: str) -> WorkerLeft | None:
    """After a call broke on a connection: :class:`WorkerLeft` once the scheduler removes one
    of ``workers``, None if none is removed within :data:`NOTICE_S` seconds."""
    deadline = time.monotonic() + NOTICE_S
    while (lost := _left(client, workers, what)) is None and time.monotonic() < deadline:
        time.sleep(WATCH_S)
    return lost


def _watched(client: Client, workers: list[str], what: str, timeout: float,
             call: Callable[[], Any]) -> Any:
    """``call()``'s result, run aside while ``workers`` are watched: :class:`WorkerLeft` as soon
    as one of them leaves the cluster, :class:`WorkerSilent` past ``timeout`` seconds. A call
    given up on goes on in its own (daemon) thread to its own bound."""
    answers: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()

    def run() -> None:
        try:
            answers.put((True, call()))
        except Exception as exc:  # noqa: BLE001 - handed to the caller below
            answers.put((False, exc))

    threading.Thread(target=run, daemon=True, name=f"gnnpipe: asking for {what}").start()
    deadline = time.monotonic() + timeout
    while True:
        try:
            ok, value = answers.get(timeout=WATCH_S)
        except queue.Empty:
            lost = _left(client, workers, what)
            if lost is not None:
                raise lost from None
            if time.monotonic() >= deadline:
                raise WorkerSilent(silent(client, workers), what, timeout) from None
            continue
        if ok:
            return value
        if isinstance(value, _TIMEOUTS):
            raise WorkerSilent(silent(client, workers), what, timeout) from value
        lost = _noticed(client, workers, what) if isinstance(value, (OSError, KeyError)) else None
        if lost is not None:  # a CommClosedError, or the scheduler's KeyError for a worker
            raise lost from value  # it just removed
        raise value


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
    :class:`WorkerSilent` naming the silent workers after ``timeout`` seconds, or
    :class:`WorkerLeft` once one of them leaves the cluster."""
    return dict(_watched(client, workers, what, timeout, lambda: client.run(
        function, *args, workers=workers, callback_timeout=timeout)))


def result_within(client: Client, future: Future, worker: str, timeout: float,
                  what: str) -> Any:
    """``future``'s result (a task pinned to ``worker``) within ``timeout`` seconds, as long as
    ``worker`` stays (:class:`WorkerSilent`, :class:`WorkerLeft`; the task cancelled)."""
    try:
        return _watched(client, [worker], what, timeout, lambda: future.result(timeout=timeout))
    except (WorkerSilent, WorkerLeft):
        client.cancel([future])
        raise


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
    # Client.scatter's own timeout= bounds only the wait for workers, not the sending
    return _watched(client, workers, what, bound, lambda: client.sync(
        client._scatter, value, workers=workers, broadcast=True, hash=False, timeout=bound,
        callback_timeout=bound))
