"""`Run`: what a training job returns — history, best epoch, measured timeline and bytes — and
`RunHandle`, what every mode's handle offers."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import pandas as pd

from gnnpipe.analysis import efficiency as eff
from gnnpipe.core.job import Launch, TrainConfig
from gnnpipe.core.prediction import Prediction
from gnnpipe.core.timeline import Timeline

__all__ = ["EVENT_COLUMNS", "HISTORY_COLUMNS", "MEMORY_COLUMNS", "Run", "RunHandle", "RunResults",
           "best_epoch", "events_frame", "history_from", "memory_from"]

HISTORY_COLUMNS = ("epoch", "loss", "train_acc", "val_acc", "test_acc", "val_loss",
                   "epoch_time", "comm_bytes")
#: ``run.events``: a resume from a checkpoint folder or a restart after a failure, from ``epoch``
#: (the first epoch it ran again); ``attempt`` counts restarts, ``rank`` and ``cause`` name the
#: failure that caused a restart.
EVENT_COLUMNS = ("epoch", "event", "attempt", "rank", "cause")
#: ``run.memory()``: per rank, the most resident memory its run added to its process
#: (``peak_bytes``), the resident size it started from (``baseline_bytes``) and torch's peak on a
#: CUDA device (``device_peak_bytes``, 0 on the CPU); :mod:`gnnpipe.engine.memory` says how.
#: ``heap_trims``: how often a rank near its Dask ``memory_limit`` or its plan's handed freed heap
#: back to the OS (:class:`~gnnpipe.engine.memory.HeapCeiling`; each costs time, 0 far from a
#: limit).
MEMORY_COLUMNS = ("rank", "peak_bytes", "baseline_bytes", "device_peak_bytes", "heap_trims")


def events_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """``rows`` as a frame of :data:`EVENT_COLUMNS`; ``rank`` is an integer column whose
    missing values (a resume, a worker lost before its rank started) are ``<NA>``."""
    frame = pd.DataFrame(rows, columns=list(EVENT_COLUMNS))
    frame["rank"] = frame["rank"].astype("Int64")
    return frame


def history_from(records: list[dict[str, Any]], restarts: bool = False) -> pd.DataFrame:
    """Merge per-rank epoch records: metrics from the rank that has them, the slowest rank's
    epoch time, the bytes of all ranks and, with ``restarts``, the attempt (restarts before it)
    that ran the epoch as a ``restarts`` column."""
    columns = list(HISTORY_COLUMNS) + (["restarts"] if restarts else [])
    if not records:
        return pd.DataFrame(columns=columns)
    frame = pd.DataFrame(records)
    if "attempt" not in frame:
        frame["attempt"] = 0
    per_epoch = frame.groupby("epoch").agg(epoch_time=("epoch_time", "max"),
                                           comm_bytes=("comm_bytes", "sum"),
                                           restarts=("attempt", "max"))
    # an epoch is in once a loss-holding rank reported it; metrics only on evaluation epochs
    losses = _lowest_rank(frame, "loss", ["loss"])
    metrics = _lowest_rank(frame, "val_acc", ["train_acc", "val_acc", "test_acc", "val_loss"])
    merged = per_epoch.join(losses, how="inner").join(metrics, how="left").reset_index()
    return merged.reindex(columns=columns)


def memory_from(records: list[dict[str, Any]]) -> pd.DataFrame:
    """Per rank, the highest ``peak_bytes`` and ``device_peak_bytes`` its epoch records carry and
    the ``baseline_bytes`` of its latest attempt (:data:`MEMORY_COLUMNS`; older checkpoints'
    records without them are skipped)."""
    rows = [r for r in records if "peak_bytes" in r]
    if not rows:
        return pd.DataFrame(columns=list(MEMORY_COLUMNS)).astype("int64")
    # records from before trims were counted have none: 0
    frame = pd.DataFrame(rows).reindex(columns=list(MEMORY_COLUMNS)).fillna({"heap_trims": 0})
    per_rank = frame.groupby("rank").agg(
        peak_bytes=("peak_bytes", "max"), baseline_bytes=("baseline_bytes", "last"),
        device_peak_bytes=("device_peak_bytes", "max"), heap_trims=("heap_trims", "max"))
    return per_rank.reset_index().reindex(columns=list(MEMORY_COLUMNS)).astype("int64")


def _lowest_rank(frame: pd.DataFrame, key: str, columns: list[str]) -> pd.DataFrame:
    """Per epoch, ``columns`` of the lowest rank whose record has ``key``."""
    if key not in frame:
        return pd.DataFrame(columns=columns, index=pd.Index([], name="epoch"))
    rows = frame.dropna(subset=[key]).sort_values("rank", kind="stable").drop_duplicates("epoch")
    return rows.set_index("epoch").reindex(columns=columns)


def _beside(measured: dict[str, Any], prediction: Prediction) -> dict[str, Any]:
    """A plan's predictions and measured ÷ predicted, for a summary row."""
    peak = max(prediction.peak_bytes)
    return {"layout": prediction.layout, "predicted_epoch_time_s": prediction.epoch_time,
            "epoch_time_ratio": measured["epoch_time_s"] / prediction.epoch_time
            if prediction.epoch_time > 0 else float("nan"),
            "predicted_peak_bytes": peak,
            "peak_ratio": measured["peak_bytes"] / peak if peak > 0 else float("nan"),
            "predicted_comm_bytes": prediction.comm_bytes}


def _plain(value: Any) -> Any:
    """JSON for numpy scalars."""
    return value.item() if hasattr(value, "item") else str(value)


def best_epoch(history: pd.DataFrame) -> dict[str, float]:
    """The epoch with the highest validation accuracy (ties: lowest validation loss, then earliest),
    with its validation and test accuracy."""
    history = history.dropna(subset=["val_acc"])  # epochs without an evaluation (eval_every)
    if history.empty:
        return {}
    ranked = history.sort_values(["val_acc", "val_loss", "epoch"], ascending=[False, True, True])
    row = ranked.iloc[0]
    return {"epoch": int(row["epoch"]), "val_acc": float(row["val_acc"]),
            "test_acc": float(row["test_acc"])}


class RunResults:
    """What every run handle computes from its own ``config``, ``history``, ``comm``,
    ``events`` and :meth:`live_timeline`: written once, for a finished :class:`Run` and for a
    distributed run still training alike (its numbers are then those so far)."""

    config: TrainConfig
    launch: Launch | None
    history: pd.DataFrame
    comm: pd.DataFrame
    events: pd.DataFrame
    error: str | None = None
    prediction: Prediction | None = None

    def live_timeline(self) -> Timeline:
        raise NotImplementedError

    def memory(self) -> pd.DataFrame:
        """Per rank (one row, rank 0, in one-process modes): the peak memory its run added to
        its process so far (:data:`MEMORY_COLUMNS`, measured as :mod:`gnnpipe.engine.memory`
        says, the same way in every mode)."""
        raise NotImplementedError

    @property
    def best(self) -> dict[str, float]:
        """``{epoch, val_acc, test_acc}``: test accuracy at the best validation epoch."""
        return best_epoch(self.history)

    def to_chrome_trace(self, path: str | Path) -> Path:
        """Write the measured timeline as a Trace Event Format file (opens in Perfetto)."""
        return self.live_timeline().to_chrome_trace(path)

    def save(self, folder: str | Path) -> Path:
        """Write ``history.csv``, ``trace.json``, ``timeline.json``, ``comm.csv``, ``events.csv``,
        ``memory.csv`` (:meth:`memory`), ``config.json`` (the job, :meth:`TrainConfig.to_dict`,
        with the launch's run id, predicted bytes and plan memory limit, and ``status: failed``
        and the ``error`` of a failed run) and, for a run trained from a plan, ``prediction.json``
        (:attr:`prediction`) into ``folder``."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        timeline = self.live_timeline()
        self.history.to_csv(folder / "history.csv", index=False)
        timeline.to_json(folder / "timeline.json")
        timeline.to_chrome_trace(folder / "trace.json")
        self.comm.to_csv(folder / "comm.csv", index=False)
        self.events.to_csv(folder / "events.csv", index=False)
        self.memory().to_csv(folder / "memory.csv", index=False)
        config = {**self.config.to_dict(), **(self.launch.to_dict() if self.launch else {})}
        if self.error is not None:
            config.update(status="failed", error=self.error)
        (folder / "config.json").write_text(json.dumps(config, indent=2, default=str))
        if self.prediction is not None:
            (folder / "prediction.json").write_text(
                json.dumps(self.prediction.to_dict(), indent=1, default=_plain))
        return folder

    def efficiency(self, reference: float | None = None) -> pd.DataFrame:
        """Per epoch of a distributed run: measured span, ideal epoch, parallel efficiency
        (ideal ÷ measured) and the ranks' mean compute / communication / waiting / idle shares
        (:mod:`gnnpipe.analysis.efficiency`). ``reference``: a measured one-process chunked epoch
        in seconds for the ideal (default: the ranks' compute summed). Empty for one-process
        modes."""
        layout = eff.Layout.of(self.config)
        if layout is None:
            return eff.efficiency(Timeline(), eff.Layout(1))
        return eff.efficiency(self.live_timeline(), layout, reference)

    def rank_shares(self) -> pd.DataFrame:
        """Per rank: median share of its epochs spent computing, communicating, waiting, idle."""
        return eff.rank_shares(self.live_timeline())

    def summary(self) -> pd.DataFrame:
        """One row: mode, best epoch and accuracies, median epoch time, bytes per epoch, the
        highest rank's peak memory (``peak_bytes``, :meth:`memory`), for distributed runs the
        median parallel efficiency and time shares (first epoch skipped) and, for a run trained
        from a plan, what it predicted beside them (``predicted_epoch_time_s``,
        ``predicted_peak_bytes``, ``predicted_comm_bytes`` and measured ÷ predicted ratios)."""
        h = self.history
        memory = self.memory()
        row = {"mode": self.config.mode.value, **self.best,
               "epoch_time_s": float(h["epoch_time"].median()) if len(h) else float("nan"),
               "comm_bytes_per_epoch": float(h["comm_bytes"].median()) if len(h) else 0.0,
               "peak_bytes": int(memory["peak_bytes"].max()) if len(memory) else 0}
        if self.prediction is not None:
            row.update(_beside(row, self.prediction))
        per_epoch = self.efficiency()
        if len(per_epoch) > 1:
            per_epoch = per_epoch.iloc[1:]
        if len(per_epoch):
            shares = [f"{c}_share" for c in eff.CLASSES]
            row.update(per_epoch[["efficiency", *shares]].median().rename(
                {"efficiency": "parallel_efficiency"}).to_dict())
        return pd.DataFrame([row])

    def __repr__(self) -> str:
        best, mode = self.best, self.config.mode.value
        if not best:
            return f"{type(self).__name__}(mode={mode!r}, no epochs)"
        return (f"{type(self).__name__}(mode={mode!r}, epochs={len(self.history)}, "
                f"best epoch {best['epoch']}: val {best['val_acc']:.4f}, "
                f"test {best['test_acc']:.4f})")


@dataclass(repr=False)
class Run(RunResults):
    """A finished training job's results.

    Attributes:
        config: the job it ran (:class:`~gnnpipe.core.job.TrainConfig`).
        history: one row per epoch with :data:`HISTORY_COLUMNS`.
        timeline: measured ops (rank, stage, chunk, kind, start, end, bytes, ...).
        comm: bytes sent per (src, dst, kind); empty for one-process modes.
        partitioning: the chunking (chunked modes) or METIS partitioning (graph) it used.
        data: the graph it trained on.
        events: resumes and restarts (:data:`EVENT_COLUMNS`); empty for a run that had none.
        peaks: what :meth:`memory` returns (:func:`memory_from` of the epoch records).
        launch: a distributed run's id and predicted bytes (None in one process).
        error: why the run failed (None for a run that finished).
        prediction: what the plan it was trained from predicted (None without one).
    """

    config: TrainConfig
    history: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=HISTORY_COLUMNS))
    timeline: Timeline = field(default_factory=Timeline)
    comm: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(columns=["src", "dst", "kind", "bytes"]))
    partitioning: Any = None  # the chunking or partitioning the run used (for views)
    data: Any = None  # the graph, in the original node order
    events: pd.DataFrame = field(default_factory=lambda: events_frame([]))
    launch: Launch | None = None
    error: str | None = None
    peaks: pd.DataFrame = field(default_factory=lambda: memory_from([]))
    prediction: Prediction | None = None

    @property
    def done(self) -> bool:
        return True

    def memory(self) -> pd.DataFrame:
        """Per rank: the peak memory its run added (:data:`MEMORY_COLUMNS`)."""
        return self.peaks.copy()

    def wait(self, timeout: float | None = None) -> Run:
        """A finished run: itself."""
        return self

    def stop(self) -> None:
        """One-process runs finish before ``train`` returns; nothing to stop."""

    def live_timeline(self) -> Timeline:
        """The measured timeline (the whole of it: the run is finished)."""
        return self.timeline

    def subscribe(self, callback: Callable[[dict[str, Any], list[dict[str, Any]]], None]) -> None:
        """Call ``callback(record, ops)`` for every epoch a rank reports from now on. Callbacks run
        on the client's event thread and must not block (the dashboard only appends to a
        bounded queue). A finished run reports nothing more."""


@runtime_checkable
class RunHandle(Protocol):
    """What ``gp.train`` returns in every mode: a finished :class:`Run`, or a
    :class:`~gnnpipe.runtime.handle.DistributedRun` that may still be training
    (``background=True``)."""

    config: TrainConfig
    launch: Launch | None
    partitioning: Any
    data: Any
    prediction: Prediction | None

    @property
    def history(self) -> pd.DataFrame: ...

    @property
    def timeline(self) -> Timeline: ...

    @property
    def comm(self) -> pd.DataFrame: ...

    @property
    def events(self) -> pd.DataFrame: ...

    @property
    def best(self) -> dict[str, float]: ...

    @property
    def done(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> RunHandle: ...

    def stop(self) -> None: ...

    def live_timeline(self) -> Timeline: ...

    def subscribe(self, callback: Callable[[dict[str, Any], list[dict[str, Any]]], None]) -> None:
        ...

    def to_chrome_trace(self, path: str | Path) -> Path: ...

    def save(self, folder: str | Path) -> Path: ...

    def efficiency(self, reference: float | None = None) -> pd.DataFrame: ...

    def rank_shares(self) -> pd.DataFrame: ...

    def memory(self) -> pd.DataFrame: ...

    def summary(self) -> pd.DataFrame: ...
