"""Where a run's ranks go, and what a running rank is doing.

Ranks go to workers that hold no other gnnpipe rank, chosen and submitted under one cluster-wide
Dask lock, so concurrent runs (from any client) spread over the cluster instead of queueing on
the same workers. A probe run on a worker tells a rank waiting on a peer from one stuck in its
own code (the hung rank its peers timed out waiting for).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from distributed import Client, Future, Lock

__all__ = ["CLAIM_LOCK", "claim", "claim_lock", "probe", "rank_key", "rank_prefix"]

logger = logging.getLogger(__name__)

CLAIM_LOCK = "gnnpipe-claim"
_POLL_S = 0.5
_VISIBLE_S = 10.0  # after submitting, wait up to this long for the scheduler to list the ranks
_PROBE_S = 10.0  # a probe of the ranks' threads gives up after this long (a stopped worker)
#: Code a rank blocked on a peer sits in (torch.distributed calls, ``Comm.wait_all``).
_PEER_WAIT_FILES = ("/torch/distributed/", "/gnnpipe/runtime/comm.py")


def rank_prefix(topic: str) -> str:
    """What the Dask keys of the run ``topic``'s rank tasks start with (the rank follows)."""
    return f"gnnpipe-{topic}-rank"


def rank_key(topic: str, rank: int) -> str:
    return f"{rank_prefix(topic)}{rank}"


def _is_rank_key(key: Any) -> bool:
    return isinstance(key, str) and key.startswith("gnnpipe-") and "-rank" in key


def claim_lock(client: Client) -> Lock:
    """The lock every gnnpipe launcher on this scheduler takes to choose and free workers."""
    return Lock(CLAIM_LOCK, scheduler_rpc=client.scheduler, loop=client.loop)


def _free_workers(client: Client) -> list[str]:
    """Workers holding no gnnpipe rank: idle ones first, then ones busy with other tasks, each
    group by address (so a lone run on an idle cluster takes the first workers)."""
    processing = client.processing()
    free = [w for w, keys in processing.items() if not any(_is_rank_key(k) for k in keys)]
    return sorted(free, key=lambda w: (bool(processing[w]), w))


def claim(client: Client, world: int, timeout: float,
          submit: Callable[[list[str]], list[Future]]) -> tuple[list[str], list[Future]]:
    """Choose ``world`` free workers and ``submit(workers)`` the ranks there, under the claim
    lock; while other gnnpipe runs hold too many workers, wait for them up to ``timeout`` s."""
    lock = claim_lock(client)
    deadline = time.monotonic() + timeout
    waiting = False
    while True:
        left = deadline - time.monotonic()
        if left > 0 and lock.acquire(timeout=left):
            try:
                free = _free_workers(client)
                if len(free) >= world:
                    futures = submit(free[:world])
                    _await_listed(client, futures)
                    return free[:world], futures
            finally:
                lock.release()
            if not waiting:
                logger.warning("the run waits for busy workers: it needs %d free of other "
                               "gnnpipe runs, %d are (waiting up to timeout=%g s)",
                               world, len(free), timeout)
                waiting = True
        if time.monotonic() >= deadline:
            raise TimeoutError(f"cluster: the run needs {world} workers free of other gnnpipe "
                               f"runs, got {len(_free_workers(client))} free after waiting "
                               f"timeout={timeout:g} s")
        time.sleep(_POLL_S)


def _await_listed(client: Client, futures: list[Future]) -> None:
    """Wait until the scheduler lists the new ranks as processing (so the next claim sees them)."""
    deadline = time.monotonic() + _VISIBLE_S
    while time.monotonic() < deadline:
        listed = {k for keys in client.processing().values() for k in keys}
        if all(f.key in listed or f.done() for f in futures):
            return
        time.sleep(0.05)


def _rank_threads(prefix: str, dask_worker: Any = None) -> dict[str, bool]:
    """Run on a worker (``client.run``): each task whose key starts with ``prefix`` that a thread
    still executes (even after its future was cancelled), and whether that thread is waiting on
    a peer (inside torch.distributed or ``Comm``) rather than in its own code."""
    frames = sys._current_frames()
    out: dict[str, bool] = {}
    for ident, key in list(dask_worker.active_threads.items()):
        if isinstance(key, str) and key.startswith(prefix):
            frame = frames.get(ident)
            path = frame.f_code.co_filename.replace("\\", "/") if frame is not None else ""
            out[key] = any(p in path for p in _PEER_WAIT_FILES)
    return out


def probe(client: Client, workers: list[str], prefix: str) -> dict[str, bool]:
    """:func:`_rank_threads` over ``workers`` (those still connected), merged by key."""
    alive = set(client.scheduler_info(n_workers=-1)["workers"])
    targets = [w for w in workers if w in alive]
    if not targets:
        return {}
    try:
        found = client.run(_rank_threads, prefix, workers=targets, on_error="return",
                           callback_timeout=_PROBE_S)
    except Exception as exc:  # noqa: BLE001 - a worker leaving mid-probe: nothing to report
        logger.debug("probing the ranks failed: %s", exc)
        return {}
    return {k: v for res in found.values() if isinstance(res, dict) for k, v in res.items()}
