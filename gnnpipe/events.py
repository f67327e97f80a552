"""Event schema and the `Timeline` table shared by the simulator and the runtime."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

import pandas as pd

#: Columns of every Timeline, predicted (simulator) or measured (runtime), in this order.
COLUMNS: tuple[str, ...] = (
    "rank", "stage", "way", "chunk", "epoch", "kind", "start", "end", "bytes", "peer",
)
#: Op kinds a Timeline row may carry.
KINDS: tuple[str, ...] = ("forward", "backward", "send", "recv", "allreduce", "step", "idle")

_DTYPES = {
    "rank": "int64", "stage": "int64", "way": "int64", "chunk": "int64", "epoch": "int64",
    "kind": "object", "start": "float64", "end": "float64", "bytes": "int64", "peer": "int64",
}


@dataclass(frozen=True)
class OpEvent:
    """One executed or predicted op. ``chunk`` and ``peer`` are -1 where they do not apply."""

    rank: int
    stage: int
    way: int
    chunk: int
    epoch: int
    kind: str
    start: float
    end: float
    bytes: int = 0
    peer: int = -1


class Timeline:
    """A table of ops (one row each) with the columns of :data:`COLUMNS`.

    Times are seconds from a common origin. Built by :func:`gnnpipe.simulate` (predicted)
    and by the runtime (measured), so the same views and metrics serve both.
    """

    def __init__(self, frame: pd.DataFrame | None = None) -> None:
        if frame is None:
            frame = pd.DataFrame({c: pd.Series(dtype=t) for c, t in _DTYPES.items()})
        missing = [c for c in COLUMNS if c not in frame.columns]
        if missing:
            raise ValueError(f"Timeline frame lacks columns {missing}; expected {list(COLUMNS)}")
        self.df = frame.loc[:, list(COLUMNS)].astype(_DTYPES).reset_index(drop=True)

    @classmethod
    def from_events(cls, events: Iterable[OpEvent | dict]) -> "Timeline":
        rows = [asdict(e) if isinstance(e, OpEvent) else dict(e) for e in events]
        if not rows:
            return cls()
        return cls(pd.DataFrame(rows))

    @classmethod
    def concat(cls, timelines: Iterable["Timeline"]) -> "Timeline":
        frames = [t.df for t in timelines if len(t.df)]
        return cls(pd.concat(frames, ignore_index=True)) if frames else cls()

    def __len__(self) -> int:
        return len(self.df)

    def __repr__(self) -> str:
        ranks = self.df["rank"].nunique() if len(self) else 0
        return f"Timeline({len(self)} ops, {ranks} ranks, makespan={self.makespan():.6g}s)"

    @property
    def num_ranks(self) -> int:
        return int(self.df["rank"].max()) + 1 if len(self) else 0

    def makespan(self) -> float:
        """Seconds from the first op's start to the last op's end."""
        if not len(self):
            return 0.0
        return float(self.df["end"].max() - self.df["start"].min())

    def busy_time(self) -> pd.Series:
        """Busy seconds per rank (sum of op durations, idle rows excluded)."""
        work = self.df[self.df["kind"] != "idle"]
        return (work["end"] - work["start"]).groupby(work["rank"]).sum()

    def bubble_fraction(self) -> float:
        """Idle rank-time over ``ranks × makespan``."""
        span = self.makespan()
        if span <= 0:
            return 0.0
        ranks = self.df["rank"].nunique()
        return float(1.0 - self.busy_time().sum() / (ranks * span))

    def to_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.df.to_json(orient="records"))
        return path

    @classmethod
    def read_json(cls, path: str | Path) -> "Timeline":
        return cls.from_events(json.loads(Path(path).read_text()))
