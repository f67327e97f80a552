"""`DistributedRun`: the handle of a run on Dask workers. Its history and timeline grow live from
the ranks' per-epoch events; it restarts every rank from the newest checkpoint after a failure,
as often as ``restarts`` allows."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import pandas as pd
from distributed import Event

from gnnpipe import checkpoint as ckpt
from gnnpipe.analysis import efficiency as eff
from gnnpipe.core.prediction import Prediction
from gnnpipe.core.timeline import Timeline
from gnnpipe.core.units import format_bytes
from gnnpipe.run import RunResults, events_frame, history_from, memory_from
from gnnpipe.runtime.advice import memory_advice, not_memory
from gnnpipe.runtime.asking import WorkerLeft
from gnnpipe.runtime.cluster import Cluster
from gnnpipe.runtime.launch import FailureKind, RankFailure, launch
from gnnpipe.runtime.spec import JobSpec, RankResult

__all__ = ["DistributedRun"]

logger = logging.getLogger(__name__)

_training: set[DistributedRun] = set()  # runs whose thread has not ended yet
_training_lock = threading.Lock()


def _stop_at_exit() -> None:
    """When the main thread ends (``threading._shutdown``, before the interpreter joins the
    runs' non-daemon threads and before the ``atexit`` handlers where Dask closes its clusters
    and clients): stop the runs still training at their next epoch boundary and wait until
    each closed its cluster. Else a run's thread would close its cluster while the interpreter
    finalizes (Dask's ``sync`` then fails: ``UnboundLocalError``), or keep the script alive
    until its last epoch."""
    with _training_lock:
        runs = list(_training)
    for run in runs:
        if not run._stopping:
            logger.warning("the script ends while %s trains: stopping it at the next epoch "
                           "boundary (run.wait() lets it finish)", run.spec.topic)
        try:
            run.stop()
        except Exception as exc:  # noqa: BLE001 - its cluster may be gone; join it anyway
            logger.warning("stopping %s at exit failed: %s", run.spec.topic, exc)
    for run in runs:
        run._thread.join(timeout=2.0)
        if run._thread.is_alive():  # a long epoch: say why the script does not end yet
            logger.warning("waiting for %s to stop at its epoch boundary and close (Ctrl-C "
                           "abandons it)", run.spec.topic)
            run._thread.join()


# Private but kept since Python 3.9 for the same need (concurrent.futures joins its workers
# with it); without it the non-daemon threads still end before finalization, only later.
getattr(threading, "_register_atexit", lambda _: None)(_stop_at_exit)


class DistributedRun(RunResults):
    """A run on Dask workers; with ``background=True`` it returns before training ends.

    ``history`` grows live from the ranks' per-epoch events; ``wait()`` blocks until the end and
    raises :class:`~gnnpipe.runtime.launch.RankFailure` if a rank failed, or
    :class:`~gnnpipe.runtime.asking.WorkerLeft` if a worker died before its rank started (after
    ``restarts`` restarts); ``stop()`` makes all ranks stop together at the next epoch boundary. Its
    summaries (:class:`~gnnpipe.run.RunResults`) are those of the epochs so far while it trains.
    """

    def __init__(self, spec: JobSpec, cluster: Cluster, owned: bool, model: Any,
                 recovery: ckpt.Recovery, partitioning: Any, data: Any) -> None:
        self.spec, self.cluster, self._owned = spec, cluster, owned
        self.config, self.launch = spec.job, spec.launch
        self.partitioning, self.data = partitioning, data
        self.prediction: Prediction | None = None  # what a plan predicted (gp.train sets it)
        self.timeline = Timeline()  # the whole run's, once it is done (live_timeline() before)
        self.comm = pd.DataFrame(columns=["src", "dst", "kind", "bytes"])
        self.error: str | None = None
        self._history: pd.DataFrame | None = None  # the final history, once done
        self._memory: pd.DataFrame | None = None  # the final per-rank peaks, once done
        self._model, self._recovery = model, recovery
        self._live: list[dict[str, Any]] = []  # this attempt's records
        self._live_ops: list[dict[str, Any]] = []
        self._prior: list[dict[str, Any]] = []  # records of the epochs before it (a checkpoint's)
        self._attempt = 0
        self._event_rows = recovery.events()
        self._listeners: list[Any] = []
        self._when_done: list[Callable[[DistributedRun], None]] = []
        self._lock = threading.Lock()
        self._error: BaseException | None = None  # read by the dashboard
        self._finished = threading.Event()
        self.workers: list[str] = []  # rank r ran on workers[r] (set when the run ends)
        self._stop = Event(spec.stop_event, client=cluster.client)
        self._stopping = False  # stop() was called
        self._ended = False  # set under _control before the thread unsubscribes and closes
        self._control = threading.Lock()
        cluster.client.subscribe_topic(spec.topic, self._on_event)
        # Not a daemon: the interpreter never finalizes under a thread that still closes its
        # cluster (_stop_at_exit stops it first, so the script does not wait for every epoch).
        self._thread = threading.Thread(target=self._main, name=f"gnnpipe-{spec.topic}")

    # ------------------------------------------------------------------ the result, live
    @property
    def history(self) -> pd.DataFrame:
        if self._history is not None:
            return self._history
        with self._lock:
            return history_from(self._prior + self._live, self._recovery.restarts > 0)

    def memory(self) -> pd.DataFrame:
        """Per rank: the peak memory its run added so far (:data:`gnnpipe.run.MEMORY_COLUMNS`;
        after a restart, the restarted attempt's)."""
        if self._memory is not None:
            return self._memory.copy()
        with self._lock:
            return memory_from(list(self._live))

    @property
    def events(self) -> pd.DataFrame:
        """Resumes and restarts (:data:`gnnpipe.run.EVENT_COLUMNS`)."""
        with self._lock:
            return events_frame(list(self._event_rows))

    @property
    def done(self) -> bool:
        return self._finished.is_set()

    def live_timeline(self) -> Timeline:
        """The measured timeline so far (the full one once the run is done); after a restart,
        the timeline of the attempt since."""
        if self.done and self._error is None:
            return self.timeline
        with self._lock:
            return Timeline.from_events(list(self._live_ops))

    def __repr__(self) -> str:
        if self.done:
            return super().__repr__()
        return f"DistributedRun({self.config.mode.value!r}, training)"

    # ------------------------------------------------------------------ control
    def wait(self, timeout: float | None = None) -> DistributedRun:
        if not self._finished.wait(timeout):
            raise TimeoutError(f"run still training after {timeout} s")
        self._call_when_done()
        if self._error is not None:
            raise self._error
        return self

    def when_done(self, callback: Callable[[DistributedRun], None]) -> None:
        """Call ``callback(run)`` once the run has ended, in the thread whose :meth:`wait` sees
        it end (at once if it already has and is waited on): a notebook's dashboard redraws its
        cell's output with the finished run there, while the cell that waits still runs."""
        with self._lock:
            self._when_done.append(callback)
        if self.done:
            self._call_when_done()

    def _call_when_done(self) -> None:
        with self._lock:
            callbacks, self._when_done = self._when_done, []
        for callback in callbacks:
            try:
                callback(self)
            except Exception:  # a broken viewer must never break the run
                logger.exception("when_done callback failed")

    def stop(self) -> None:
        """Ask every rank to stop at the end of the current epoch; nothing once the run ended
        (its stop event lives on a scheduler that an owned cluster has closed by then)."""
        with self._control:
            if self._ended:
                return
            self._stopping = True
            self._stop.set()

    def subscribe(self, callback: Any) -> None:
        """Call ``callback(record, ops)`` for every epoch a rank reports from now on (on the
        client's event thread; it must not block)."""
        with self._lock:
            self._listeners.append(callback)

    def start(self) -> DistributedRun:
        with _training_lock:
            _training.add(self)
        self._thread.start()
        return self

    # ------------------------------------------------------------------ internals
    def _on_event(self, event: tuple[float, dict[str, Any]]) -> None:
        record = dict(event[1])
        ops = record.pop("ops", [])
        with self._lock:
            if record.get("attempt", 0) != self._attempt:  # late news from a failed attempt
                return
            self._live.append(record)
            self._live_ops.extend(ops)
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(record, ops)
            except Exception:  # a broken viewer must never break the run
                logger.exception("run listener failed")

    def _main(self) -> None:
        try:
            self._collect(self._attempts())
        except BaseException as exc:  # noqa: BLE001 - handed to wait(), which re-raises it
            self._error = exc
        finally:
            with self._control:  # from here on stop() does nothing
                self._ended = True
            try:
                self.cluster.client.unsubscribe_topic(self.spec.topic)
                if self._owned:
                    self.cluster.close()
            finally:
                with _training_lock:
                    _training.discard(self)
                self._finished.set()

    def _attempts(self) -> list[RankResult]:
        """Launch the ranks; after a failure (a rank's, or a worker that left before the ranks
        started), while restarts are left, launch them again from the newest checkpoint (the
        resumed one, or epoch 0, if none was written since)."""
        manifest, number = self._recovery.resume, 0
        self._begin(0, manifest)
        while True:
            try:
                return launch(self.spec, self.cluster, number,
                              manifest.folder if manifest is not None else None)
            except (RankFailure, WorkerLeft) as failure:
                if number >= self._recovery.restarts or self._stop.is_set():
                    if isinstance(failure, WorkerLeft):
                        raise
                    raise self._explained(failure) from failure
                root = self._recovery.root
                manifest = (ckpt.latest(root) if root else None) or self._recovery.resume
                number += 1
                self._begin(number, manifest, failure)  # launch waits for restarted workers

    def _explained(self, failure: RankFailure) -> RankFailure:
        """``failure``, for a worker that died, with what its rank last reported holding, its
        worker's memory limit, and the options that need less memory per rank."""
        if failure.kind is not FailureKind.DIED:
            return failure
        with self._lock:
            records = [r for r in self._live if r.get("rank") == failure.rank]
        parts = [failure.cause]
        if failure.memory_limit:
            parts.append(f"its worker's Dask memory_limit is {format_bytes(failure.memory_limit)} "
                         "(the nanny restarts a worker at 95% of it)")
        held = None
        if records and "peak_bytes" in records[-1]:
            last = records[-1]
            held = int(last["peak_bytes"]) + int(last["baseline_bytes"])
            parts.append(f"by epoch {last['epoch']} the rank's process held up to "
                         f"{format_bytes(held)}")
        with self._lock:  # what a rank's process held before its run (any rank's: alike)
            baselines = [int(r["baseline_bytes"]) for r in self._live if "baseline_bytes" in r]
        room = (int(0.95 * failure.memory_limit) - max(baselines)
                if failure.memory_limit and baselines else None)
        elsewhere = not_memory(self._model, self.data, self.config, failure.rank, held,
                               failure.memory_limit, room)
        parts.append(elsewhere or "if it ran out of memory: " + memory_advice(
            self._model, self.data, self.config, failure.rank, room, self.cluster.allocator))
        return RankFailure(failure.rank, "; ".join(parts), failure.kind, failure.memory_limit)

    def _begin(self, number: int, manifest: ckpt.Manifest | None,
               failure: RankFailure | WorkerLeft | None = None) -> None:
        """Attempt ``number`` starts at ``manifest``'s epoch with its records as the history
        (after ``failure``: a restart event naming its rank, or, for a worker that left before
        the ranks started, the worker, with no rank)."""
        epoch = manifest.epoch if manifest is not None else 0
        with self._lock:
            self._attempt, self._live, self._live_ops = number, [], []
            self._prior = list(manifest.records) if manifest is not None else []
            if isinstance(failure, RankFailure):
                self._event_rows.append({"epoch": epoch, "event": "restart", "attempt": number,
                                         "rank": failure.rank, "cause": failure.cause})
            elif failure is not None:
                self._event_rows.append({
                    "epoch": epoch, "event": "restart", "attempt": number, "rank": None,
                    "cause": f"{', '.join(failure.workers)} left before the ranks started: "
                             f"{failure.why}"})
        if failure is not None:
            logger.warning("%s; restart %d of %d from epoch %d", failure, number,
                           self._recovery.restarts, epoch)

    def _collect(self, results: list[RankResult]) -> None:
        state: dict[str, Any] = {}
        for result in results:
            state.update(result.state)
        self.workers = [r.worker for r in sorted(results, key=lambda r: r.rank)]
        self._model.load_state_dict(state)
        records = self._prior + [r for res in results for r in res.records]
        self._memory = memory_from([r for res in results for r in res.records])
        history = history_from(records, self._recovery.restarts > 0)
        self.timeline = Timeline.from_events([e for res in results for e in res.events])
        layout = eff.Layout.of(self.config)
        if layout is not None:  # a distributed config always has one
            efficiency = eff.efficiency(self.timeline, layout).set_index("epoch")["efficiency"]
            history["efficiency"] = history["epoch"].map(efficiency)
        self.comm = pd.DataFrame([row for res in results for row in res.comm],
                                 columns=["src", "dst", "kind", "bytes"])
        self._history = history
