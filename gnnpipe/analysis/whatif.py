"""What if: a run's measured op costs, re-simulated under other schedules and chunk counts.

:func:`costs_from` reads a Timeline (measured or simulated) into :class:`OpCosts`: the median
seconds of every ``(kind, stage, chunk)`` op over epochs and ways, the optimizer step per stage,
and the transfer delay between stages. :func:`predict` simulates any schedule with them and
:func:`what_if` tabulates predicted epochs for several schedules and chunk counts beside the
measured one. Assumptions where a schedule differs from the run's:

- another chunk count ``C'``: each op costs its stage's per-chunk mean times ``C / C'`` (a
  stage's epoch work is conserved), and so does a transfer;
- ``v`` virtual stages per rank (interleaved 1F1B): virtual stage ``k`` holds ``1/v`` of the
  layers of measured stage ``k // v`` and costs ``1/v`` of its op;
- a split backward (ZB-H1): ``backward`` (input gradient) and ``weight`` each cost half of the
  measured backward.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import pandas as pd

from gnnpipe.analysis.catalogue import BUILTIN, build
from gnnpipe.core.timeline import Timeline
from gnnpipe.schedule import Op, Schedule
from gnnpipe.schedule.simulator import simulate

__all__ = [
    "OpCosts",
    "costs_from",
    "epoch_times",
    "predict",
    "what_if",
]

@dataclass(frozen=True)
class OpCosts:
    """Op costs of a pipeline (see the module docstring for how other schedules use them).

    Attributes:
        stages: Pipeline stages ``S`` of the run.
        chunks: Chunks each pipeline way runs per epoch ``C``.
        table: Seconds per ``(kind, stage, chunk)`` for ``forward``/``backward`` and per
            ``("step", stage)``.
        comm: Seconds of one transfer between stages.
        exact_chunks: Whether ``table``'s chunk indices are the schedule's own (one way).
    """

    stages: int
    chunks: int
    table: Mapping[tuple, float] = field(default_factory=dict)
    comm: float = 0.0
    exact_chunks: bool = True

    @classmethod
    def uniform(cls, stages: int, chunks: int, forward: float, backward: float,
                step: float = 0.0, comm: float = 0.0) -> OpCosts:
        """Every stage's forward and backward op costs the same (the explorer's costs)."""
        table: dict[tuple, float] = {("step", s): step for s in range(stages)}
        for s in range(stages):
            for c in range(chunks):
                table["forward", s, c], table["backward", s, c] = forward, backward
        return cls(stages, chunks, table, comm)

    def stage_mean(self, kind: str, stage: int) -> float:
        """Mean seconds of a ``kind`` op of ``stage`` over its chunks."""
        values = [t for k, t in self.table.items() if k[:2] == (kind, stage) and len(k) == 3]
        return sum(values) / len(values)

    def cost_function(self, schedule: Schedule) -> Callable[[Op], float]:
        """``op -> seconds`` for ``schedule`` (same stage count, or ``v`` times it)."""
        if schedule.num_stages % self.stages or schedule.num_ranks != self.stages:
            raise ValueError(f"schedule: expected {self.stages} ranks and a multiple of {self.stages} "
                             f"stages, got {schedule.num_ranks} ranks, {schedule.num_stages} stages")
        v = schedule.num_stages // self.stages
        split = any(op.kind == "weight" for op in schedule.ops())
        same = v == 1 and self.exact_chunks and schedule.num_chunks == self.chunks
        scale = self.chunks / schedule.num_chunks

        def cost(op: Op) -> float:
            if op.kind == "step":
                return sum(self.table["step", (j * self.stages + op.stage) // v]
                           for j in range(v)) / v
            kind = "backward" if op.kind == "weight" else op.kind
            stage = op.stage // v
            seconds = (self.table[kind, stage, op.chunk] if same
                       else self.stage_mean(kind, stage) * scale)
            return seconds / v / (2 if split and kind == "backward" else 1)
        return cost

    def comm_for(self, schedule: Schedule) -> float:
        """Transfer delay under ``schedule``: scaled with the chunk size."""
        return self.comm * self.chunks / schedule.num_chunks


def _transfer_delay(work: pd.DataFrame) -> float:
    """Median over epochs of the smallest wait between an op and the cross-rank op it feeds
    (forward ``s−1 → s``, backward ``s+1 → s``): the transfer delay where a rank waited."""
    keys = ["kind", "stage", "way", "chunk", "epoch"]
    src = work[keys + ["rank", "end"]].copy()
    src["stage"] += src["kind"].map({"forward": 1, "backward": -1})
    pairs = work[keys + ["rank", "start"]].merge(src, on=keys, suffixes=("", "_src"))
    pairs = pairs[pairs["rank"] != pairs["rank_src"]]
    if pairs.empty:
        return 0.0
    gaps = (pairs["start"] - pairs["end"]).groupby(pairs["epoch"]).min()
    return max(float(gaps.median()), 0.0)


def costs_from(timeline: Timeline) -> OpCosts:
    """Median op costs of a chunked pipeline timeline (measured or simulated).

    Raises:
        ValueError: If the timeline has no per-chunk forward and backward ops (a graph-parallel
            or one-process run, or an empty timeline).
    """
    df = timeline.df
    work = df[df["kind"].isin(["forward", "backward"]) & (df["chunk"] >= 0)]
    if work.empty or set(work["kind"]) != {"forward", "backward"}:
        raise ValueError("timeline: expected a pipeline run's timeline with per-chunk forward and "
                         f"backward ops, got kinds {sorted(df['kind'].unique())}")
    stages, ways = int(work["stage"].max()) + 1, int(work["way"].nunique())
    seconds = (work["end"] - work["start"]).groupby(
        [work["kind"], work["stage"], work["chunk"]]).median()
    table: dict[tuple, float] = {(k, int(s), int(c)): float(t) for (k, s, c), t in seconds.items()}
    steps = df[df["kind"] == "step"]
    step_s = (steps["end"] - steps["start"]).groupby(steps["stage"]).median()
    for s in range(stages):
        table["step", s] = float(step_s.get(s, 0.0))
    chunks = int(work["chunk"].nunique()) // ways
    return OpCosts(stages, chunks, table, _transfer_delay(work), exact_chunks=ways == 1)


def predict(costs: OpCosts, schedule: Schedule) -> Timeline:
    """Simulate ``schedule`` with ``costs`` (:meth:`OpCosts.cost_function`, :meth:`comm_for`)."""
    return simulate(schedule, costs.cost_function(schedule), comm=costs.comm_for(schedule))


def epoch_times(timeline: Timeline) -> pd.Series:
    """Seconds from the first to the last training op of each epoch (forward, backward, step,
    transfers); evaluation-only rows without a chunk are left out, bar the step."""
    df = timeline.df
    train = df[(df["chunk"] >= 0) | (df["kind"] == "step")]
    grouped = train.groupby("epoch")
    return (grouped["end"].max() - grouped["start"].min()).rename("epoch_s")


def what_if(timeline: Timeline, names: Iterable[str] = BUILTIN,
            chunk_counts: Iterable[int] | None = None, virtual: int = 2,
            own: str = "gnnpipe") -> pd.DataFrame:
    """Predicted epochs of ``names`` × ``chunk_counts`` with the timeline's measured costs, beside
    the measured epoch (median over epochs).

    Returns:
        One row per (schedule, chunks): ``predicted_s``, ``bubble``, ``peak_inflight`` (max over
        ranks) and ``measured_s`` (NaN except the run's ``own`` schedule at its chunk count;
        gnnpipe for every run the runtime records). Schedules
        a chunk count does not suit (interleaved needs a multiple of the stages) are left out.
    """
    costs = costs_from(timeline)
    counts = sorted(set(chunk_counts or {max(costs.chunks // 2, 1), costs.chunks, 2 * costs.chunks}))
    measured = float(epoch_times(timeline).median())
    rows = []
    for name in names:
        for c in counts:
            if name == "interleaved" and c % costs.stages:
                continue
            tl = predict(costs, build(name, costs.stages, c, virtual, step=True))
            is_own = name == own and c == costs.chunks
            rows.append({"schedule": name, "chunks": c, "predicted_s": tl.makespan(),
                         "bubble": tl.bubble_fraction(),
                         "peak_inflight": int(tl.peak_inflight().max()),
                         "measured_s": measured if is_own else math.nan})
    return pd.DataFrame(rows, columns=["schedule", "chunks", "predicted_s", "bubble",
                                       "peak_inflight", "measured_s"])
