"""Launch one rank per Dask worker, watch them, fail fast naming the rank."""

from __future__ import annotations

import enum
import logging
import time
import uuid
from dataclasses import dataclass

from dask.utils import format_bytes
from distributed import Future, wait
from distributed.client import FuturesCancelledError

from gnnpipe.run import history_from  # noqa: F401 - where the dashboard merges live records
from gnnpipe.runtime.asking import WorkerLeft, ask, graph_bytes, result_within, scatter_within
from gnnpipe.runtime.cluster import Absence, Cluster, free_port, local_ranks
from gnnpipe.runtime.placement import claim, claim_lock, probe, rank_key, rank_prefix
from gnnpipe.runtime.rank import run_rank
from gnnpipe.runtime.spec import Attempt, JobSpec, RankResult

__all__ = ["Failure", "FailureKind", "RankFailure", "launch", "new_topic"]

logger = logging.getLogger(__name__)

_GRACE_S = 1.0  # after a rank's own error, wait this long for an earlier root cause
_FALLOUT_GRACE_S = 15.0  # with only peers' fallout so far, wait this long for the dead worker
_DEAD_AFTER_S = 3.0  # absent this long while a peer has failed: the worker died
_SURELY_DEAD_AFTER_S = 60.0  # absent this long: dead even if no peer noticed
_SETTLE_S = 2.0  # after cancelling, a rank still running this long is stuck
_HUNG = "stopped answering (its peers timed out waiting for it)"


class FailureKind(enum.Enum):
    """How a rank failed, most telling first."""

    DIED = "died"  # its worker process died
    RAISED = "raised"  # it raised in its own code
    HUNG = "hung"  # it stopped answering: its peers timed out waiting for it
    CANCELLED = "cancelled"  # the scheduler cancelled its task (it forgot it)
    FALLOUT = "fallout"  # an error that only echoes another rank's failure


_RANKING = {FailureKind.DIED: 0, FailureKind.RAISED: 1, FailureKind.HUNG: 1,
            FailureKind.CANCELLED: 1, FailureKind.FALLOUT: 2}
#: Kinds that may only echo a worker's death, which takes a few seconds to show.
_ECHOES = (FailureKind.CANCELLED, FailureKind.FALLOUT)


@dataclass(frozen=True)
class Failure:
    """One rank's failure as the launcher saw it."""

    rank: int
    kind: FailureKind
    cause: str

    def ranking(self) -> tuple[int, int]:
        """Sort key of the root cause: a dead worker, then a rank's own error or hang, then
        fallout; lower ranks first."""
        return _RANKING[self.kind], self.rank


class RankFailure(RuntimeError):
    """A rank raised, hung or its worker process died (``kind``: a :class:`FailureKind`);
    ``memory_limit``: the Dask ``memory_limit`` of the rank's worker in bytes (0: none)."""

    def __init__(self, rank: int, cause: str, kind: FailureKind = FailureKind.RAISED,
                 memory_limit: int = 0) -> None:
        super().__init__(f"rank {rank} failed: {cause}")
        self.rank, self.cause, self.kind, self.memory_limit = rank, cause, kind, memory_limit


def _is_fallout(exc: BaseException) -> bool:
    """Errors that only echo another rank's failure (a peer closing its connections)."""
    text = str(exc).lower()
    return any(s in text for s in ("connection closed", "connection reset", "gloo", "timed out",
                                   "broken pipe", "socket"))


def launch(spec: JobSpec, cluster: Cluster, number: int = 0,
           resume: str | None = None) -> list[RankResult]:
    """Run ``spec`` with one rank per worker free of other gnnpipe runs (attempt ``number``,
    resuming from the checkpoint folder ``resume`` if given); raise :class:`RankFailure` naming
    the first rank that failed (a dead worker first, then a rank's own error or a hung rank,
    over its peers' fallout)."""
    cluster.require(spec.world, spec.job.timeout)  # a restarted worker may not be back yet
    topic = f"{spec.topic}-{number}" if number else spec.topic  # fresh task keys per attempt
    workers, futures = claim(
        cluster.client, spec.world, spec.job.timeout,
        lambda chosen: _submit(spec, cluster, chosen, topic, number, resume))
    prefix = rank_prefix(topic)
    limits = cluster.memory_limits(workers)
    failures = _watch(cluster, workers, futures, prefix)
    if failures:
        _release(cluster, workers, futures, prefix)
        first = min(failures.values(), key=Failure.ranking)
        raise RankFailure(first.rank, first.cause, first.kind,
                          limits.get(workers[first.rank], 0))
    results = [f.result() for f in futures]
    for result, worker in zip(results, workers):
        result.worker = worker
    return results


def _submit(spec: JobSpec, cluster: Cluster, workers: list[str], topic: str, number: int,
            resume: str | None) -> list[Future]:
    """One ``run_rank`` task per worker, rank ``r`` pinned to ``workers[r]``."""
    client, timeout = cluster.client, spec.job.timeout
    cluster.keep_running(workers, timeout)
    host, port = result_within(client, client.submit(free_port, workers=[workers[0]], pure=False),
                               workers[0], timeout, "a free port for the ranks' rendezvous")
    attempt = Attempt(f"tcp://{host}:{port}", cluster.threads_per_worker, number, resume)
    shipped = _ship(spec, cluster, workers)
    return [client.submit(run_rank, shipped, r, attempt, local, workers=[w],
                          allow_other_workers=False, pure=False, retries=0,
                          key=rank_key(topic, r))
            for r, (w, local) in enumerate(zip(workers, local_ranks(workers)))]


def _ship(spec: JobSpec, cluster: Cluster, workers: list[str]) -> Future:
    """``spec`` (the model and graph) scattered to ``workers``. A worker that dies receiving it
    (killed at its Dask ``memory_limit``, most often: the graph arrives on top of a worker's
    start size) fails the run with an error naming it, what it held and its limit; one that
    does not answer within the run's ``timeout`` (stopped, swapping) fails it naming it."""
    from gnnpipe.engine.memory import resident_bytes

    client, timeout = cluster.client, spec.job.timeout
    limits = cluster.memory_limits(workers)
    held = ask(client, resident_bytes, workers, timeout=timeout,
               what="its resident memory") if any(limits.values()) else {}
    graph = graph_bytes(spec.data)
    try:
        return scatter_within(client, spec, workers, graph, timeout, "the run's model and graph")
    except WorkerLeft as exc:
        said = "; ".join(
            f"{w} held {format_bytes(held.get(w, 0))} of its memory_limit "
            f"{format_bytes(limits[w])}" if limits.get(w) else f"{w} (no memory_limit)"
            for w in exc.workers)
        raise WorkerLeft(exc.workers, exc.what, exc.why, message=(
            f"cluster: a worker left while the run's model and graph ({format_bytes(graph)} of "
            f"tensors) were sent to it: {said} before they arrived (torch, PyG, gnnpipe and "
            f"Dask loaded); {exc.why}. The nanny kills a worker "
            f"past 95% of its memory_limit: give the workers a memory_limit above their start "
            f"size, the graph and each rank's need (gp.estimate_memory)")) from exc


def _watch(cluster: Cluster, workers: list[str], futures: list[Future],
           prefix: str) -> dict[int, Failure]:
    """Wait for the ranks; on a failure return each failed rank's :class:`Failure`, once the
    root cause had its grace time to show up."""
    rank_of = {f.key: r for r, f in enumerate(futures)}
    pending = set(futures)
    failures: dict[int, Failure] = {}
    absence = Absence(cluster, workers)
    first_failure: float | None = None
    while pending:
        try:
            wait(list(pending), timeout=0.5, return_when="FIRST_COMPLETED")
        except (TimeoutError, FuturesCancelledError):  # a cancelled rank is recorded below
            pass
        pending = {f for f in pending if not f.done()}
        for f in futures:
            if rank_of[f.key] not in failures and f.status in ("error", "cancelled"):
                failures[rank_of[f.key]] = _failure(rank_of[f.key], f)
        now = time.monotonic()
        _note_dead(absence, workers, failures)
        if not failures:
            continue
        first_failure = first_failure or now
        waited = now - first_failure
        kinds = {f.kind for f in failures.values()}
        if not kinds <= set(_ECHOES):  # a rank's own error, a hang or a dead worker
            if waited >= _GRACE_S or not pending:
                break
        # a cancelled task is its own event (a dead worker it echoes is looked for below)
        elif FailureKind.CANCELLED in kinds or _hung_after_fallout(
                cluster, workers, failures, waited, sorted(rank_of[f.key] for f in pending),
                prefix):
            break
    if first_failure is not None and all(f.kind in _ECHOES for f in failures.values()):
        _await_dead(absence, workers, failures, first_failure + _DEAD_AFTER_S + _GRACE_S)
    return failures


def _hung_after_fallout(cluster: Cluster, workers: list[str], failures: dict[int, Failure],
                        waited: float, running: list[int], prefix: str) -> bool:
    """Only fallout so far: a rank still running in its own code while its peers timed out
    waiting for it is the hung one (added to ``failures``); else give a dead worker time to be
    noticed. Whether to stop waiting."""
    late = waited >= _FALLOUT_GRACE_S or not running
    if late or (waited >= _GRACE_S and any("timed out" in f.cause.lower()
                                            for f in failures.values())):
        hung = _hung(cluster, workers, running, prefix, late) if running else []
        failures.update({r: Failure(r, FailureKind.HUNG, _HUNG) for r in hung})
        return bool(hung) or late
    return False


def _failure(rank: int, future: Future) -> Failure:
    """The failure of a rank whose task erred or was cancelled under the run (by the scheduler
    once it forgot the task: its worker died and took the task's inputs along, most often)."""
    if future.status == "cancelled":
        return Failure(rank, FailureKind.CANCELLED,
                       "its task was cancelled by the Dask scheduler")
    exc = future.exception()
    kind = FailureKind.FALLOUT if _is_fallout(exc) else FailureKind.RAISED
    return Failure(rank, kind, f"{type(exc).__name__}: {exc}")


def _await_dead(absence: Absence, workers: list[str], failures: dict[int, Failure],
                deadline: float) -> None:
    """Every rank ended with fallout or a cancelled task: give a dead worker, the cause those
    may echo, until ``deadline`` (monotonic seconds) to be noticed."""
    while True:
        _note_dead(absence, workers, failures)
        if time.monotonic() >= deadline or any(f.kind is FailureKind.DIED
                                                for f in failures.values()):
            return
        time.sleep(0.25)


def _note_dead(absence: Absence, workers: list[str], failures: dict[int, Failure]) -> None:
    """Mark the ranks whose worker left the scheduler for good as dead: at once where the
    scheduler says it removed the worker (and why), else once it has been missing for a while."""
    absent = absence.seconds()
    for r, w in enumerate(workers):
        if not absent[w] or (r in failures and failures[r].kind not in _ECHOES):
            continue
        # A missing worker the scheduler has no removal of yet is confirmed by its peers'
        # broken connections, or by time.
        why = absence.removed(w)
        confirmed = absent[w] >= _DEAD_AFTER_S and any(q != r for q in failures)
        if why is not None or confirmed or absent[w] >= _SURELY_DEAD_AFTER_S:
            failures[r] = Failure(r, FailureKind.DIED, why or "its worker process died")


def _hung(cluster: Cluster, workers: list[str], running: list[int], prefix: str,
          fallback: bool) -> list[int]:
    """Of the ranks still running while their peers failed only with fallout (timeouts, closed
    connections), those stuck in their own code (not waiting on a peer); with ``fallback``,
    when there are none, every rank still running."""
    threads = probe(cluster.client, [workers[r] for r in running], prefix)
    waiting = {int(key[len(prefix):]): w for key, w in threads.items()}
    return [r for r in running if waiting.get(r) is False] or (running if fallback else [])


def _release(cluster: Cluster, workers: list[str], futures: list[Future], prefix: str) -> None:
    """Cancel the ranks, then restart only the workers whose rank still runs (stuck in a
    collective or in its own code); ranks that ended need nothing, and a dead worker is brought
    back by its nanny. Other runs and other clients' tasks keep running. Done under the claim
    lock, so no run is placed on a worker about to restart."""
    lock = claim_lock(cluster.client)
    held = lock.acquire(timeout=_SETTLE_S * 10)
    try:
        for f in futures:
            f.cancel()
        deadline = time.monotonic() + _SETTLE_S
        while True:  # a rank just hit by its peer's failure ends by itself within moments
            stuck = sorted({workers[int(k[len(prefix):])]
                            for k in probe(cluster.client, workers, prefix)})
            if not stuck or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        if stuck:
            logger.info("restarting %d worker(s) whose rank is stuck: %s", len(stuck), stuck)
            cluster.restart(stuck)
    except Exception as exc:  # noqa: BLE001 - the rank's failure matters more
        logger.warning("freeing the workers after a failed run did not finish: %s", exc)
    finally:
        if held:
            lock.release()


def new_topic() -> str:
    return f"gnnpipe-{uuid.uuid4().hex[:8]}"
