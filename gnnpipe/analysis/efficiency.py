"""Where each rank's epoch goes (compute, communication, waiting, idle) and parallel efficiency,
read from a measured (or simulated) `Timeline`.

Every instant of a rank's epoch is put in exactly one class, in this order of precedence:

- ``compute``: a forward, backward or optimizer step runs;
- ``communication``: an all-reduce runs, or the rank blocks until its sends complete (a send
  row spans ``isend`` to its completion; only the part that overlaps no other op is charged);
- ``waiting``: a blocking receive (the data is late: its producer is still computing, or the
  transfer takes that long);
- ``idle``: none of these (Python between ops, the fill and drain of the pipeline).

Parallel efficiency of an epoch is ``ideal ÷ measured``. The measured epoch is the span of its
training ops over all ranks (evaluation excluded). The ideal is the one-process chunked epoch
divided over the ranks, stretched by the fill-drain bubble: ``T1 / R × (C' + S − 1) / C'`` with
``C'`` the chunks each pipeline way runs (``C / W``). ``T1`` is a measured one-process epoch when
one is given (``reference``), else the ranks' compute summed (what one process would spend at the
ranks' own speed, so a slow rank environment does not show up as lost efficiency then).

How the figures relate, per epoch (``c``, ``m``, ``w``, ``i`` the ranks' mean shares):
``c + m + w + i = 1``; the epoch's **bubble** (``Timeline.bubble_fraction`` of its ops, the
timeline's title) is ``1 − c = m + w + i``; and without ``reference`` the **efficiency** is
``(1 − bubble) × (C' + S − 1) / C'``, since the ideal is then the summed compute ÷ ``R`` times
that stretch.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from gnnpipe.core.job import TrainConfig
from gnnpipe.core.kinds import Mode
from gnnpipe.core.timeline import Timeline

__all__ = ["CLASSES", "Layout", "efficiency", "rank_breakdown", "rank_shares"]

#: Classes of a rank's time, in order of precedence.
CLASSES: tuple[str, ...] = ("compute", "communication", "waiting", "idle")
_CLASS_OF = {"forward": 0, "backward": 0, "step": 0, "allreduce": 1, "recv": 2, "send": 3}
_SEND_CLASS = 3  # charged as communication, below waiting


@dataclass(frozen=True)
class Layout:
    """How a run's ranks are arranged: ``stages`` per pipeline way, ``ways`` pipelines, ``chunks``
    in all (graph parallelism: ``stages = ways = chunks = 1`` and ``ranks`` partitions)."""

    ranks: int
    stages: int = 1
    ways: int = 1
    chunks: int = 1

    @classmethod
    def of(cls, config: TrainConfig | None) -> Layout | None:
        """The layout of a run's job; None for one-process modes (and an unknown job)."""
        if config is None or not config.mode.distributed:
            return None
        if config.mode is Mode.GRAPH:
            return cls(ranks=config.parts)
        return cls(ranks=config.stages * config.ways, stages=config.stages, ways=config.ways,
                   chunks=config.chunks)

    @property
    def bubble_stretch(self) -> float:
        """``(C' + S − 1) / C'``: the fill-drain schedule's makespan over its busy time."""
        per_way = self.chunks / self.ways
        return (per_way + self.stages - 1) / per_way

    def ideal(self, one_process_epoch: float) -> float:
        """The best epoch these ranks can reach from a one-process epoch of that length."""
        return one_process_epoch / self.ranks * self.bubble_stretch


def _classify(ops: pd.DataFrame, lo: float, hi: float) -> list[float]:
    """Seconds of ``[lo, hi)`` in each of :data:`CLASSES` for one rank's ops (a sweep over
    the op boundaries; at each instant the highest-precedence running op wins)."""
    ops = ops[ops["kind"].isin(list(_CLASS_OF))]
    classes = ops["kind"].map(_CLASS_OF)
    events = sorted([(s, 1, c) for s, c in zip(ops["start"].clip(lo, hi), classes)]
                    + [(e, -1, c) for e, c in zip(ops["end"].clip(lo, hi), classes)])
    running = [0] * (_SEND_CLASS + 1)
    totals = [0.0] * len(CLASSES)
    now = lo
    for time, delta, cls in events:
        current = next((c for c, n in enumerate(running) if n > 0), None)
        slot = len(CLASSES) - 1 if current is None else (1 if current == _SEND_CLASS else current)
        totals[slot] += time - now
        running[cls] += delta
        now = time
    totals[-1] += hi - now
    return totals


def rank_breakdown(timeline: Timeline) -> pd.DataFrame:
    """Per (epoch, rank): the epoch's span over all ranks and the seconds of each class
    (training ops: :meth:`~gnnpipe.core.timeline.Timeline.training`)."""
    rows = []
    for epoch, ops in timeline.training().df.groupby("epoch"):
        lo, hi = float(ops["start"].min()), float(ops["end"].max())
        for rank, mine in ops.groupby("rank"):
            rows.append({"epoch": int(epoch), "rank": int(rank), "span": hi - lo,
                         **dict(zip(CLASSES, _classify(mine, lo, hi)))})
    return pd.DataFrame(rows, columns=["epoch", "rank", "span", *CLASSES])


def efficiency(timeline: Timeline, layout: Layout, reference: float | None = None) -> pd.DataFrame:
    """Per epoch: measured span, ideal epoch, parallel efficiency and the ranks' mean share of
    each class. ``reference``: a measured one-process chunked epoch (seconds) for the ideal;
    without it the ranks' summed compute stands in (see the module docstring)."""
    per_rank = rank_breakdown(timeline)
    if per_rank.empty:
        return pd.DataFrame(columns=["epoch", "span", "ideal", "efficiency",
                                     *[f"{c}_share" for c in CLASSES]])
    grouped = per_rank.groupby("epoch")
    frame = grouped.agg(span=("span", "first"), compute_total=("compute", "sum"))
    one_process = frame["compute_total"] if reference is None else reference
    frame["ideal"] = layout.ideal(1.0) * one_process
    frame["efficiency"] = frame["ideal"] / frame["span"]
    for c in CLASSES:
        frame[f"{c}_share"] = grouped.apply(lambda g, c=c: (g[c] / g["span"]).mean(),
                                            include_groups=False)
    return frame.drop(columns="compute_total").reset_index()


def rank_shares(timeline: Timeline, skip_first: bool = True) -> pd.DataFrame:
    """Per rank: median share of its epochs in each class (first epoch skipped: warm-up)."""
    per_rank = rank_breakdown(timeline)
    if skip_first and per_rank["epoch"].nunique() > 1:
        per_rank = per_rank[per_rank["epoch"] > per_rank["epoch"].min()]
    shares = per_rank[list(CLASSES)].div(per_rank["span"], axis=0).assign(rank=per_rank["rank"])
    return shares.groupby("rank").median()
