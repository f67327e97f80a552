"""`Run`: what a training job returns — history, best epoch, measured timeline and bytes."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from gnnpipe import efficiency as eff
from gnnpipe.events import Timeline

HISTORY_COLUMNS = ("epoch", "loss", "train_acc", "val_acc", "test_acc", "val_loss",
                   "epoch_time", "comm_bytes")
#: ``run.events``: a resume from a checkpoint folder or a restart after a failure, from ``epoch``
#: (the first epoch it ran again); ``attempt`` counts restarts, ``rank`` and ``cause`` name the
#: failure that caused a restart.
EVENT_COLUMNS = ("epoch", "event", "attempt", "rank", "cause")


def events_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=list(EVENT_COLUMNS))


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


def _lowest_rank(frame: pd.DataFrame, key: str, columns: list[str]) -> pd.DataFrame:
    """Per epoch, ``columns`` of the lowest rank whose record has ``key``."""
    if key not in frame:
        return pd.DataFrame(columns=columns, index=pd.Index([], name="epoch"))
    rows = frame.dropna(subset=[key]).sort_values("rank", kind="stable").drop_duplicates("epoch")
    return rows.set_index("epoch").reindex(columns=columns)


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


@dataclass
class Run:
    """A training job's results.

    Attributes:
        config: the arguments it ran with (plain values).
        history: one row per epoch with :data:`HISTORY_COLUMNS`.
        timeline: measured ops (rank, stage, chunk, kind, start, end, bytes, ...).
        comm: bytes sent per (src, dst, kind); empty for one-process modes.
        partitioning: the chunking (chunked modes) or METIS partitioning (graph) it used.
        data: the graph it trained on.
        events: resumes and restarts (:data:`EVENT_COLUMNS`); empty for a run that had none.
    """

    config: dict[str, Any]
    history: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=HISTORY_COLUMNS))
    timeline: Timeline = field(default_factory=Timeline)
    comm: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(columns=["src", "dst", "kind", "bytes"]))
    partitioning: Any = None  # the chunking or partitioning the run used (for views)
    data: Any = None  # the graph, in the original node order
    events: pd.DataFrame = field(default_factory=lambda: events_frame([]))

    @property
    def best(self) -> dict[str, float]:
        """``{epoch, val_acc, test_acc}``: test accuracy at the best validation epoch."""
        return best_epoch(self.history)

    @property
    def done(self) -> bool:
        return True

    def wait(self) -> Run:
        return self

    def stop(self) -> None:
        """One-process runs finish before ``train`` returns; nothing to stop."""

    def live_timeline(self) -> Timeline:
        """The measured timeline so far (for finished runs, the whole of it)."""
        return self.timeline

    def subscribe(self, callback: Callable[[dict[str, Any], list[dict[str, Any]]], None]) -> None:
        """Call ``callback(record, ops)`` for every epoch a rank reports from now on. Callbacks run
        on the client's event thread and must not block (the dashboard only appends to a
        bounded queue). A finished run reports nothing more."""

    def to_chrome_trace(self, path: str | Path) -> Path:
        """Write the measured timeline as a Trace Event Format file (opens in Perfetto)."""
        return self.timeline.to_chrome_trace(path)

    def save(self, folder: str | Path) -> Path:
        """Write ``history.csv``, ``trace.json``, ``timeline.json``, ``comm.csv``, ``events.csv``
        and ``config.json`` into ``folder``."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.history.to_csv(folder / "history.csv", index=False)
        self.timeline.to_json(folder / "timeline.json")
        self.to_chrome_trace(folder / "trace.json")
        self.comm.to_csv(folder / "comm.csv", index=False)
        self.events.to_csv(folder / "events.csv", index=False)
        (folder / "config.json").write_text(json.dumps(self.config, indent=2, default=str))
        return folder

    def efficiency(self, reference: float | None = None) -> pd.DataFrame:
        """Per epoch of a distributed run: measured span, ideal epoch, parallel efficiency
        (ideal ÷ measured) and the ranks' mean compute / communication / waiting / idle shares
        (:mod:`gnnpipe.efficiency`). ``reference``: a measured one-process chunked epoch in
        seconds for the ideal (default: the ranks' compute summed). Empty for one-process modes."""
        layout = eff.Layout.of(self.config)
        if layout is None:
            return eff.efficiency(Timeline(), eff.Layout(1))
        return eff.efficiency(self.live_timeline(), layout, reference)

    def rank_shares(self) -> pd.DataFrame:
        """Per rank: median share of its epochs spent computing, communicating, waiting, idle."""
        return eff.rank_shares(self.live_timeline())

    def summary(self) -> pd.DataFrame:
        """One row: mode, best epoch and accuracies, median epoch time, bytes per epoch and, for
        distributed runs, the median parallel efficiency and time shares (first epoch skipped)."""
        h = self.history
        row = {"mode": self.config.get("mode"), **self.best,
               "epoch_time_s": float(h["epoch_time"].median()) if len(h) else float("nan"),
               "comm_bytes_per_epoch": float(h["comm_bytes"].median()) if len(h) else 0.0}
        per_epoch = self.efficiency()
        if len(per_epoch) > 1:
            per_epoch = per_epoch.iloc[1:]
        if len(per_epoch):
            shares = [f"{c}_share" for c in eff.CLASSES]
            row.update(per_epoch[["efficiency", *shares]].median().rename(
                {"efficiency": "parallel_efficiency"}).to_dict())
        return pd.DataFrame([row])

    def __repr__(self) -> str:
        best = self.best
        if not best:
            return f"Run(mode={self.config.get('mode')!r}, no epochs)"
        return (f"Run(mode={self.config.get('mode')!r}, epochs={len(self.history)}, "
                f"best epoch {best['epoch']}: val {best['val_acc']:.4f}, test {best['test_acc']:.4f})")
