"""Launch one rank per Dask worker, watch them, fail fast naming the rank, merge the results."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

import pandas as pd
from distributed import Event, Future, wait

from gnnpipe.events import Timeline
from gnnpipe.run import HISTORY_COLUMNS, Run
from gnnpipe.runtime.cluster import Cluster, free_port, local_ranks
from gnnpipe.runtime.placement import claim, claim_lock, probe, rank_key, rank_prefix
from gnnpipe.runtime.rank import JobSpec, RankResult, run_rank

logger = logging.getLogger(__name__)

_GRACE_S = 1.0  # after a rank's own error, wait this long for an earlier root cause
_FALLOUT_GRACE_S = 15.0  # with only peers' fallout so far, wait this long for the dead worker
_DEAD_AFTER_S = 3.0  # absent this long while a peer has failed: the worker died
_SURELY_DEAD_AFTER_S = 60.0  # absent this long: dead even if no peer noticed
_SETTLE_S = 2.0  # after cancelling, a rank still running this long is stuck
_HUNG = "stopped answering (its peers timed out waiting for it)"


class RankFailure(RuntimeError):
    """A rank raised or its worker process died."""

    def __init__(self, rank: int, cause: str) -> None:
        super().__init__(f"rank {rank} failed: {cause}")
        self.rank, self.cause = rank, cause


def _is_fallout(exc: BaseException) -> bool:
    """Errors that only echo another rank's failure (a peer closing its connections)."""
    text = str(exc).lower()
    return any(s in text for s in ("connection closed", "connection reset", "gloo", "timed out",
                                   "broken pipe", "socket"))


def history_from(records: list[dict[str, Any]]) -> pd.DataFrame:
    """Merge per-rank epoch records: metrics from the rank that has them, the slowest rank's
    epoch time, the bytes of all ranks."""
    if not records:
        return pd.DataFrame(columns=list(HISTORY_COLUMNS))
    frame = pd.DataFrame(records)
    per_epoch = frame.groupby("epoch").agg(epoch_time=("epoch_time", "max"),
                                           comm_bytes=("comm_bytes", "sum"))
    # an epoch is in once a loss-holding rank reported it; metrics only on evaluation epochs
    losses = _lowest_rank(frame, "loss", ["loss"])
    metrics = _lowest_rank(frame, "val_acc", ["train_acc", "val_acc", "test_acc", "val_loss"])
    merged = per_epoch.join(losses, how="inner").join(metrics, how="left").reset_index()
    return merged.reindex(columns=list(HISTORY_COLUMNS))


def _lowest_rank(frame: pd.DataFrame, key: str, columns: list[str]) -> pd.DataFrame:
    """Per epoch, ``columns`` of the lowest rank whose record has ``key``."""
    if key not in frame:
        return pd.DataFrame(columns=columns, index=pd.Index([], name="epoch"))
    rows = frame.dropna(subset=[key]).sort_values("rank").drop_duplicates("epoch")
    return rows.set_index("epoch").reindex(columns=columns)


class DistributedRun(Run):
    """A run on Dask workers; with ``background=True`` it returns before training ends.

    ``history`` grows live from the ranks' per-epoch events; ``wait()`` blocks until the end and
    raises :class:`RankFailure` if a rank failed; ``stop()`` makes all ranks stop together at the
    next epoch boundary.
    """

    def __init__(self, config: dict[str, Any], spec: JobSpec, cluster: Cluster, owned: bool,
                 model: Any) -> None:
        super().__init__(config=config)
        self.spec, self.cluster, self._owned, self._model = spec, cluster, owned, model
        self._live: list[dict[str, Any]] = []
        self._live_ops: list[dict[str, Any]] = []
        self._listeners: list[Any] = []
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._finished = threading.Event()
        self._final: pd.DataFrame | None = None
        self.peak_rss: dict[int, int] = {}
        self.workers: list[str] = []  # rank r ran on workers[r] (set when the run ends)
        self._stop = Event(spec.stop_event, client=cluster.client) if spec.stop_event else None
        cluster.client.subscribe_topic(spec.topic, self._on_event)
        self._thread = threading.Thread(target=self._main, name=f"gnnpipe-{spec.topic}", daemon=True)

    # ------------------------------------------------------------------ public handle
    @property
    def history(self) -> pd.DataFrame:  # type: ignore[override]
        if self._final is not None:
            return self._final
        with self._lock:
            return history_from(list(self._live))

    @history.setter
    def history(self, value: pd.DataFrame) -> None:
        self._final = value

    @property
    def done(self) -> bool:  # type: ignore[override]
        return self._finished.is_set()

    def wait(self, timeout: float | None = None) -> DistributedRun:  # type: ignore[override]
        if not self._finished.wait(timeout):
            raise TimeoutError(f"run still training after {timeout} s")
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        """Ask every rank to stop at the end of the current epoch."""
        if self._stop is not None:
            self._stop.set()

    # ------------------------------------------------------------------ internals
    def _on_event(self, event: tuple[float, dict[str, Any]]) -> None:
        record = dict(event[1])
        ops = record.pop("ops", [])
        with self._lock:
            self._live.append(record)
            self._live_ops.extend(ops)
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(record, ops)
            except Exception:  # a broken viewer must never break the run
                logger.exception("run listener failed")

    def subscribe(self, callback: Any) -> None:
        with self._lock:
            self._listeners.append(callback)

    def live_timeline(self) -> Timeline:
        """The measured timeline so far (the full one once the run is done)."""
        if self.done and self._error is None:
            return self.timeline
        with self._lock:
            return Timeline.from_events(list(self._live_ops))

    def start(self) -> DistributedRun:
        self._thread.start()
        return self

    def _main(self) -> None:
        try:
            self._collect(launch(self.spec, self.cluster))
        except BaseException as exc:  # noqa: BLE001 - handed to wait(), which re-raises it
            self._error = exc
        finally:
            try:
                self.cluster.client.unsubscribe_topic(self.spec.topic)
                if self._owned:
                    self.cluster.close()
            finally:
                self._finished.set()

    def _collect(self, results: list[RankResult]) -> None:
        state: dict[str, Any] = {}
        for result in results:
            state.update(result.state)
            self.peak_rss[result.rank] = result.peak_rss
        self.workers = [r.worker for r in sorted(results, key=lambda r: r.rank)]
        self._model.load_state_dict(state)
        self._final = history_from([r for res in results for r in res.records])
        self.timeline = Timeline.from_events([e for res in results for e in res.events])
        efficiency = self.efficiency().set_index("epoch")["efficiency"]
        self._final["efficiency"] = self._final["epoch"].map(efficiency)
        self.comm = pd.DataFrame([row for res in results for row in res.comm],
                                 columns=["src", "dst", "kind", "bytes"])


def launch(spec: JobSpec, cluster: Cluster) -> list[RankResult]:
    """Run ``spec`` with one rank per worker free of other gnnpipe runs; raise
    :class:`RankFailure` naming the first rank that failed (a dead worker first, then a rank's
    own error or a hung rank, over its peers' fallout)."""
    n = len(cluster.workers())
    if n < spec.world:
        raise ValueError(f"cluster: the run needs {spec.world} workers, the cluster has {n}")
    spec.threads = cluster.threads_per_worker
    workers, futures = claim(cluster.client, spec.world, spec.timeout,
                             lambda chosen: _submit(spec, cluster, chosen))
    prefix = rank_prefix(spec.topic)
    failures = _watch(cluster, workers, futures, prefix)
    if failures:
        _release(cluster, workers, futures, prefix)
        rank, cause = min(failures.items(), key=lambda kv: (not kv[1].startswith("!"),
                                                           kv[1].startswith("~"), kv[0]))
        raise RankFailure(rank, cause.lstrip("!~"))
    results = [f.result() for f in futures]
    for result, worker in zip(results, workers):
        result.worker = worker
    return results


def _submit(spec: JobSpec, cluster: Cluster, workers: list[str]) -> list[Future]:
    """One ``run_rank`` task per worker, rank ``r`` pinned to ``workers[r]``."""
    client = cluster.client
    host, port = client.submit(free_port, workers=[workers[0]], pure=False).result()
    init = f"tcp://{host}:{port}"
    shipped = client.scatter(spec, workers=workers, broadcast=True, hash=False)
    return [client.submit(run_rank, shipped, r, init, local, workers=[w],
                          allow_other_workers=False, pure=False, retries=0,
                          key=rank_key(spec.topic, r))
            for r, (w, local) in enumerate(zip(workers, local_ranks(workers)))]


def _watch(cluster: Cluster, workers: list[str], futures: list[Future],
           prefix: str) -> dict[int, str]:
    """Wait for the ranks; on a failure return ``{rank: cause}`` (``!`` a dead worker, ``~`` a
    peer's fallout, :data:`_HUNG` the rank its peers timed out on), once the root cause had its
    grace time to show up."""
    rank_of = {f.key: r for r, f in enumerate(futures)}
    pending = set(futures)
    failures: dict[int, str] = {}
    missing_since: dict[int, float] = {}
    first_failure: float | None = None
    while pending:
        try:
            wait(list(pending), timeout=0.5, return_when="FIRST_COMPLETED")
        except TimeoutError:
            pass
        pending = {f for f in pending if not f.done()}
        for f in futures:
            if f.status == "error" and rank_of[f.key] not in failures:
                exc = f.exception()
                failures[rank_of[f.key]] = ("~" if _is_fallout(exc) else "") + f"{type(exc).__name__}: {exc}"
        now = time.monotonic()
        _note_dead(set(cluster.workers()), workers, failures, missing_since, now)
        if not failures:
            continue
        first_failure = first_failure or now
        waited = now - first_failure
        if any(not cause.startswith("~") for cause in failures.values()):
            if waited >= _GRACE_S or not pending:
                break
            continue
        # Only fallout so far: a rank still running in its own code while its peers timed out
        # waiting for it is the hung one; else give a dead worker time to be noticed.
        late = waited >= _FALLOUT_GRACE_S or not pending
        if late or (waited >= _GRACE_S and any("timed out" in c.lower() for c in failures.values())):
            hung = _hung(cluster, workers, sorted(rank_of[f.key] for f in pending), prefix, late)
            failures.update({r: _HUNG for r in hung})
            if hung or late:
                break
    return failures


def _note_dead(alive: set[str], workers: list[str], failures: dict[int, str],
               missing_since: dict[int, float], now: float) -> None:
    """Mark ``!its worker process died`` on ranks whose worker left the scheduler for good."""
    for r, w in enumerate(workers):
        if w in alive:
            missing_since.pop(r, None)
            continue
        # A loaded worker can miss heartbeats and drop off the scheduler for a while; a dead
        # one also breaks its peers' connections, so their errors confirm it quickly.
        gone = now - missing_since.setdefault(r, now)
        confirmed = gone >= _DEAD_AFTER_S and any(q != r for q in failures)
        if (confirmed or gone >= _SURELY_DEAD_AFTER_S) and (
                r not in failures or failures[r].startswith("~")):
            failures[r] = "!its worker process died"


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
