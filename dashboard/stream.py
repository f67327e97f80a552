"""Where the dashboard's data comes from: a live `Run`, a Dask topic, or a saved run folder.

Training never waits for a viewer: a run hands each epoch's record to :meth:`Feed.push`, which
only appends to a bounded deque (the oldest entries drop when nobody drains it). Each browser
session drains the feed from a periodic callback through :meth:`Feed.since`.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from gnnpipe.core.job import Launch, TrainConfig
from gnnpipe.core.kinds import Mode
from gnnpipe.core.prediction import Prediction
from gnnpipe.core.timeline import Timeline
from gnnpipe.run import HISTORY_COLUMNS, memory_from

__all__ = ["Feed", "ReplaySource", "RunSource", "Snapshot", "Source", "TopicSource", "as_source",
           "rebuild_partitioning"]


@dataclass
class Feed:
    """A bounded, append-only log of epoch records and timeline rows with sequence numbers."""

    max_records: int = 100_000
    max_ops: int = 200_000
    records: deque = field(default_factory=deque)
    ops: deque = field(default_factory=deque)
    record_seq: int = 0  # sequence number of the next record
    op_seq: int = 0
    dropped: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.records = deque(maxlen=self.max_records)
        self.ops = deque(maxlen=self.max_ops)

    def push(self, record: dict[str, Any], ops: list[dict[str, Any]]) -> None:
        """O(1) per item, never blocks on a reader: called from the run's event thread."""
        with self.lock:
            if len(self.records) == self.records.maxlen:
                self.dropped += 1
            self.records.append((self.record_seq, record))
            self.record_seq += 1
            for op in ops:
                self.ops.append((self.op_seq, op))
                self.op_seq += 1

    def since(self, record_cursor: int, op_cursor: int) -> tuple[list[dict], list[dict], int, int]:
        """Records and ops with sequence numbers from the cursors on, and the new cursors."""
        with self.lock:
            return (_tail(self.records, record_cursor), _tail(self.ops, op_cursor),
                    self.record_seq, self.op_seq)


def _tail(items: deque, cursor: int) -> list:
    """The entries of ``items`` (``(seq, value)``, seq ascending) from ``cursor`` on: walks from
    the newest end, so a reader that keeps up pays for what is new, not for the whole buffer."""
    out = []
    for seq, value in reversed(items):
        if seq < cursor:
            break
        out.append(value)
    out.reverse()
    return out


@dataclass
class Snapshot:
    """Everything the views draw at one moment (``config`` None where the job is unknown: a
    run followed by its topic alone, a lone trace file)."""

    config: TrainConfig | None
    history: pd.DataFrame
    timeline: Timeline
    comm: pd.DataFrame
    done: bool
    #: per rank peak memory (``Run.memory()``; empty where the source has none)
    memory: pd.DataFrame = field(default_factory=lambda: memory_from([]))


class Source:
    """Base: the job (when known), its launch, what the plan it was trained from predicted
    (``run.prediction``; None for a run without a plan), a feed for live data, and the final
    results when known."""

    def __init__(self, config: TrainConfig | None, launch: Launch | None = None,
                 prediction: Prediction | None = None) -> None:
        self.config, self.launch, self.prediction = config, launch, prediction
        self.feed = Feed()

    @property
    def done(self) -> bool:
        return True

    def final(self) -> Snapshot | None:
        """The complete results, once the run is over (None while it trains)."""
        return None


class RunSource(Source):
    """A `Run` object in this process: live while a distributed run trains."""

    def __init__(self, run: Any) -> None:
        super().__init__(run.config, run.launch, getattr(run, "prediction", None))
        self.run = run
        self.partitioning = getattr(run, "partitioning", None)
        self.data = getattr(run, "data", None)
        run.subscribe(self.feed.push)
        for record in run.history.to_dict("records"):  # epochs reported before we subscribed
            self.feed.push(record, [])

    @property
    def done(self) -> bool:
        return bool(self.run.done)

    def final(self) -> Snapshot | None:
        if not self.run.done or getattr(self.run, "_error", None) is not None:
            return None
        return Snapshot(self.config, self.run.history, self.run.timeline, self.run.comm, True,
                        self.run.memory())


class TopicSource(Source):
    """A run on another client, followed through its Dask topic (the run id)."""

    def __init__(self, address: str, run_id: str) -> None:
        from distributed import Client

        super().__init__(None)
        self.run_id, self.scheduler = run_id, address
        self.client = Client(address)
        self.client.subscribe_topic(run_id, self._on_event)

    def _on_event(self, event: tuple[float, dict[str, Any]]) -> None:
        record = dict(event[1])
        ops = record.pop("ops", [])
        self.feed.push(record, ops)

    @property
    def done(self) -> bool:
        return False


class ReplaySource(Source):
    """A finished run saved by ``Run.save`` (``runs/<id>/``), or a lone timeline/trace file;
    a run trained from a plan also has its ``prediction.json``."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"source: no run folder or trace file at {path}")
        folder = path if path.is_dir() else path.parent
        config_file = folder / "config.json"
        raw = json.loads(config_file.read_text()) if config_file.exists() else None
        prediction_file = folder / "prediction.json"
        prediction = (Prediction.from_dict(json.loads(prediction_file.read_text()))
                      if prediction_file.exists() else None)
        super().__init__(TrainConfig.from_dict(raw) if raw else None,
                         Launch.from_dict(raw) if raw else None, prediction)
        history_file = folder / "history.csv"
        self.history = (pd.read_csv(history_file) if history_file.exists()
                        else pd.DataFrame(columns=list(HISTORY_COLUMNS)))
        timeline_file = path if path.is_file() else folder / "timeline.json"
        self.timeline = (_read_timeline(timeline_file) if timeline_file.exists() else Timeline())
        comm_file = folder / "comm.csv"
        self.comm = (pd.read_csv(comm_file) if comm_file.exists()
                     else pd.DataFrame(columns=["src", "dst", "kind", "bytes"]))
        memory_file = folder / "memory.csv"
        self.memory = pd.read_csv(memory_file) if memory_file.exists() else memory_from([])
        self._rebuilt: tuple[Any, Any] | None = None
        self.missing = ""  # why the partitioning is not shown (set by _rebuild)

    def final(self) -> Snapshot:
        return Snapshot(self.config, self.history, self.timeline, self.comm, True, self.memory)

    @property
    def data(self) -> Any:
        return self._rebuild()[0]

    @property
    def partitioning(self) -> Any:
        return self._rebuild()[1]

    def _rebuild(self) -> tuple[Any, Any]:
        """The run's graph and chunking (or METIS partitioning), made again from its config as
        the run made them, when the config names a dataset ``gnnpipe.datasets.load`` knows;
        else ``(None, None)`` and :attr:`missing` says why."""
        if self._rebuilt is None:
            self._rebuilt = (None, None)
            if self.config is None:
                self.missing = "the run folder has no config.json"
                return self._rebuilt
            try:
                self._rebuilt = rebuild_partitioning(self.config)
            except (ValueError, KeyError, OSError) as err:
                self.missing = f"the partitioning could not be rebuilt ({err})"
        return self._rebuilt


def rebuild_partitioning(config: TrainConfig) -> tuple[Any, Any]:
    """``(data, partitioning)`` of a saved run, as training made them: chunked modes
    ``chunk(data, chunks, seed, parts_per_chunk)``, graph mode
    ``partition(data, parts, "metis", seed)``; one-process ``single`` ``(data, None)``."""
    from gnnpipe import datasets
    from gnnpipe.partition import chunk, partition

    if config.dataset is None:
        raise ValueError("the run's config names no dataset")
    data = datasets.load(config.dataset)
    if config.mode is Mode.GRAPH:
        return data, partition(data, config.parts, method="metis", seed=config.seed)
    if config.mode.chunked:
        return data, chunk(data, config.chunks, seed=config.seed,
                           parts_per_chunk=config.parts_per_chunk)
    return data, None


def _read_timeline(path: Path) -> Timeline:
    """``timeline.json`` (records) or a Chrome trace written by ``to_chrome_trace``."""
    payload = json.loads(path.read_text())
    if isinstance(payload, dict) and "traceEvents" in payload:
        rows = []
        for e in payload["traceEvents"]:
            if e.get("ph") != "X":
                continue
            args = e.get("args", {})
            rows.append({"rank": e["tid"], "stage": args.get("stage", e["tid"]),
                         "way": args.get("way", 0), "chunk": args.get("chunk", -1),
                         "epoch": args.get("epoch", 0), "kind": e.get("cat", "forward"),
                         "start": e["ts"] / 1e6, "end": (e["ts"] + e["dur"]) / 1e6,
                         "bytes": args.get("bytes", 0), "peer": args.get("peer", -1)})
        return Timeline.from_events(rows)
    return Timeline.from_events(payload)


def as_source(source: Any) -> Source:
    """Accept a `Run`, a run folder or trace path, a ``(scheduler address, run id)`` pair, or a
    `Source`."""
    if isinstance(source, Source):
        return source
    if isinstance(source, (str, Path)):
        return ReplaySource(source)
    if isinstance(source, tuple) and len(source) == 2:
        return TopicSource(*source)
    if hasattr(source, "history") and hasattr(source, "config"):
        return RunSource(source)
    raise TypeError(f"source: expected a Run, a run folder, a trace file or (scheduler address, "
                    f"run id), got {type(source).__name__}")
