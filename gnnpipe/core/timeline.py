"""Event schema and the `Timeline` table shared by the simulator and the runtime."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from gnnpipe.core.kinds import OpKind

__all__ = ["BUSY_KINDS", "COLUMNS", "KINDS", "SCHEDULE_KINDS", "OpEvent", "Timeline"]

#: Columns of every Timeline, predicted (simulator) or measured (runtime), in this order.
COLUMNS: tuple[str, ...] = (
    "rank", "stage", "way", "chunk", "epoch", "kind", "start", "end", "bytes", "peer",
)
#: Op kinds a Timeline row may carry (:class:`~gnnpipe.core.kinds.OpKind`, in this order).
#: ``weight`` is the weight-gradient half of a split backward (zero-bubble schedules).
KINDS: tuple[OpKind, ...] = tuple(OpKind)

#: Op kinds a schedule may hold (``idle`` is a Timeline-only kind).
SCHEDULE_KINDS: tuple[OpKind, ...] = tuple(k for k in OpKind if k is not OpKind.IDLE)

#: Op kinds during which a rank computes; the rest of its training time is the bubble (its
#: communication, waiting and idle time: ``gnnpipe.analysis.efficiency`` classifies them).
BUSY_KINDS: tuple[OpKind, ...] = (OpKind.FORWARD, OpKind.BACKWARD, OpKind.WEIGHT, OpKind.STEP)

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
    kind: OpKind
    start: float
    end: float
    bytes: int = 0
    peer: int = -1

    def to_dict(self) -> dict[str, int | float | str]:
        """Plain values (the kind as its string): a row that msgpack (Dask's live events),
        JSON and pandas all take."""
        return {**asdict(self), "kind": str(self.kind)}


def _union_length(intervals: pd.DataFrame) -> float:
    """Total length of the union of ``[start, end)`` intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in intervals.sort_values("start").itertuples(index=False):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


class Timeline:
    """A table of ops (one row each) with the columns of :data:`COLUMNS`.

    Times are seconds from a common origin. Built by :func:`gnnpipe.schedule.simulator` (predicted)
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
    def from_events(cls, events: Iterable[OpEvent | dict]) -> Timeline:
        rows = [e.to_dict() if isinstance(e, OpEvent) else dict(e) for e in events]
        if not rows:
            return cls()
        return cls(pd.DataFrame(rows))

    @classmethod
    def concat(cls, timelines: Iterable[Timeline]) -> Timeline:
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

    def training(self) -> Timeline:
        """The training ops: every row but evaluation's transfers (sends and receives without a
        chunk), which come after an epoch's training."""
        df = self.df
        return Timeline(df[~df["kind"].isin(["send", "recv"]) | (df["chunk"] >= 0)])

    def busy_time(self) -> pd.Series:
        """Seconds each rank spends computing (forward, backward, weight gradient, optimizer
        step), counting overlapping ops once. Sends overlap compute, receives are waits and an
        all-reduce is communication, so none of them counts."""
        work = self.df[self.df["kind"].isin(BUSY_KINDS)]
        busy = {r: _union_length(g[["start", "end"]]) for r, g in work.groupby("rank")}
        ranks = sorted(self.df["rank"].unique())
        return pd.Series([busy.get(r, 0.0) for r in ranks], index=pd.Index(ranks, name="rank"),
                         dtype="float64")

    def bubble_fraction(self) -> float:
        """Rank-time not computing over ``ranks × span`` of the training ops (:meth:`training`;
        the mean of :meth:`bubble_by_rank`). For one measured epoch it is ``1 − compute`` of the
        ranks' mean shares (``communication + waiting + idle``,
        :func:`gnnpipe.analysis.efficiency.rank_breakdown`)."""
        return float(self.bubble_by_rank().mean()) if len(self) else 0.0

    def bubble_by_rank(self) -> pd.Series:
        """Each rank's share of the training span not computing: ``1 − busy_time / span``."""
        work = self.training()
        span, busy = work.makespan(), work.busy_time()
        return (1.0 - busy / span if span > 0 else busy * 0.0).rename("bubble")

    def to_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.df.to_json(orient="records"))
        return path

    @classmethod
    def read_json(cls, path: str | Path) -> Timeline:
        return cls.from_events(json.loads(Path(path).read_text()))

    def _inflight_events(self) -> pd.DataFrame:
        """``(rank, time, delta)``: +1 where a chunk's forward ends on a rank, -1 where its last
        backward-side op (``backward``, or ``weight`` when split) for that stage ends there."""
        keys = ["rank", "stage", "way", "chunk", "epoch"]
        fwd = self.df[self.df["kind"] == "forward"]
        bwd = self.df[self.df["kind"].isin(["backward", "weight"])]
        freed = bwd.groupby(keys, as_index=False)["end"].max()
        return pd.concat([
            pd.DataFrame({"rank": fwd["rank"], "time": fwd["end"], "delta": 1}),
            pd.DataFrame({"rank": freed["rank"], "time": freed["end"], "delta": -1}),
        ], ignore_index=True).sort_values(["rank", "time", "delta"], kind="stable")

    def peak_inflight(self) -> pd.Series:
        """Peak activation memory per rank, in chunks (micro-batches).

        A chunk is in flight on a rank from the end of its forward there to the end of its
        backward there (of its ``weight`` op, when the backward is split); a backward ending
        at the same instant as a forward frees first. With virtual stages each (stage, chunk)
        pair counts once.
        """
        ranks = sorted(self.df["rank"].unique())
        events = self._inflight_events()
        peak = events.groupby("rank")["delta"].cumsum().groupby(events["rank"]).max()
        return peak.reindex(ranks, fill_value=0).clip(lower=0).astype("int64").rename(
            "peak_inflight").rename_axis("rank")

    def inflight_at(self, time: float) -> pd.Series:
        """Chunks in flight per rank at ``time`` (counted as :meth:`peak_inflight` does: ops
        ending at or before ``time`` have taken effect)."""
        ranks = sorted(self.df["rank"].unique())
        events = self._inflight_events()
        now = events[events["time"] <= time].groupby("rank")["delta"].sum()
        return now.reindex(ranks, fill_value=0).clip(lower=0).astype("int64").rename(
            "inflight").rename_axis("rank")

    def to_chrome_trace(self, path: str | Path) -> Path:
        """Write the timeline as Trace Event Format JSON (Perfetto, chrome://tracing).

        One complete (``"X"``) event per row, times in microseconds, ``tid`` = rank, plus
        one ``thread_name`` metadata event per rank.
        """
        path = Path(path)
        names = {"forward": "F", "backward": "B"}
        events: list[dict] = [
            {"name": "thread_name", "ph": "M", "pid": 0, "tid": int(r),
             "args": {"name": f"rank {int(r)}"}}
            for r in sorted(self.df["rank"].unique())
        ]
        for row in self.df.itertuples(index=False):
            name = names.get(row.kind, row.kind)
            events.append({
                "name": f"{name} c{row.chunk}" if row.chunk >= 0 else name,
                "cat": row.kind, "ph": "X", "pid": 0, "tid": int(row.rank),
                "ts": float(row.start) * 1e6, "dur": float(row.end - row.start) * 1e6,
                "args": {"stage": int(row.stage), "way": int(row.way), "chunk": int(row.chunk),
                         "epoch": int(row.epoch), "bytes": int(row.bytes),
                         "peer": int(row.peer)},
            })
        path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
        return path
