"""A pipeline schedule as plain data: per-rank ordered lists of :class:`Op`, rendered as a
step × rank grid by simulating it with unit costs."""

from __future__ import annotations

import numbers
from collections.abc import Iterator
from dataclasses import dataclass, field

import pandas as pd

from gnnpipe.core.kinds import OpKind
from gnnpipe.core.timeline import SCHEDULE_KINDS
from gnnpipe.schedule.simulator import OpKey, simulate

__all__ = ["LABELS", "OP_KINDS", "Op", "OpKey", "Schedule", "backward_op", "check_positive", "forward_op",
           "weight_op"]

#: Op kinds a schedule may hold (``idle`` is a Timeline-only kind). In zero-bubble schedules
#: ``backward`` computes only the input gradient and ``weight`` the weight gradient.
OP_KINDS: tuple[OpKind, ...] = SCHEDULE_KINDS

#: One-letter labels used by the step × rank grid.
LABELS: dict[str, str] = {
    "forward": "F", "backward": "B", "weight": "W", "send": "s", "recv": "r", "allreduce": "A",
    "step": "S",
}


@dataclass(frozen=True)
class Op:
    """One op of a schedule.

    Attributes:
        kind: One of :data:`OP_KINDS`.
        stage: Pipeline stage the op computes.
        chunk: Chunk (micro-batch) index, or -1 where it does not apply (``step``).
        way: Data-parallel way (hybrid only); 0 otherwise.
        deps: Keys of the ops that must end before this one may start. Ops that come
            earlier on the same rank need not be listed: a rank runs its list in order.
            A dependency on another rank stands for an implicit send/recv.
    """

    kind: OpKind
    stage: int
    chunk: int
    way: int = 0
    deps: tuple[OpKey, ...] = ()

    def __post_init__(self) -> None:
        if self.kind in OP_KINDS:  # a plain string names its kind; others are refused by Schedule
            object.__setattr__(self, "kind", OpKind(self.kind))

    @property
    def key(self) -> OpKey:
        """The ``(kind, stage, chunk, way)`` key other ops use to depend on this one."""
        return (self.kind, self.stage, self.chunk, self.way)

    @property
    def label(self) -> str:
        """Short grid label such as ``"F3"`` or ``"S"``."""
        letter = LABELS.get(self.kind, self.kind)
        return letter if self.chunk < 0 else f"{letter}{self.chunk}"


@dataclass(frozen=True, repr=False)
class Schedule:
    """Per-rank ordered op lists.

    Attributes:
        name: Schedule family, e.g. ``"gnnpipe"``.
        num_stages: Number of pipeline stages.
        num_chunks: Number of chunks (micro-batches) per epoch.
        ranks: ``ranks[r]`` is the ordered tuple of ops rank ``r`` runs.

    ``str(schedule)`` is a step × rank grid computed by simulating the schedule with
    every op costing one step: each row shows what every rank runs at that step
    (``F3`` forward of chunk 3, ``B3`` its backward, ``W3`` its weight gradient, ``S``
    optimizer step, ``.`` idle). With more stages than ranks (virtual stages), a letter tells
    which of its stages a rank runs: stage ``r + j·ranks`` of rank ``r`` is letter ``j``
    (``F3a``, ``F3b``, ...).
    """

    name: str
    num_stages: int
    num_chunks: int
    ranks: tuple[tuple[Op, ...], ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", tuple(tuple(ops) for ops in self.ranks))
        check_positive("num_stages", self.num_stages)
        check_positive("num_chunks", self.num_chunks)
        seen: set[OpKey] = set()
        for r, ops in enumerate(self.ranks):
            for op in ops:
                self._check_op(r, op)
                if op.key in seen:
                    raise ValueError(f"ranks: op {op.key} appears more than once")
                seen.add(op.key)
        for op in self.ops():
            unknown = [d for d in op.deps if tuple(d) not in seen]
            if unknown:
                raise ValueError(f"ranks: op {op.key} depends on unknown ops {unknown}")

    def _check_op(self, rank: int, op: Op) -> None:
        if not isinstance(op, Op):
            raise TypeError(f"ranks[{rank}] must hold Op objects, got {type(op).__name__}")
        if op.kind not in OP_KINDS:
            raise ValueError(f"ranks[{rank}]: op kind {op.kind!r} is not one of {OP_KINDS}")
        if not 0 <= op.stage < self.num_stages:
            raise ValueError(f"ranks[{rank}]: op {op.key} has stage outside [0, {self.num_stages})")
        if not -1 <= op.chunk < self.num_chunks:
            raise ValueError(f"ranks[{rank}]: op {op.key} has chunk outside [-1, {self.num_chunks})")

    @property
    def num_ranks(self) -> int:
        """Number of ranks (op lists)."""
        return len(self.ranks)

    def ops(self) -> Iterator[Op]:
        """All ops, rank by rank, each rank in its run order."""
        for ops in self.ranks:
            yield from ops

    def __len__(self) -> int:
        return sum(len(ops) for ops in self.ranks)

    def __repr__(self) -> str:
        return (f"Schedule({self.name!r}, ranks={self.num_ranks}, stages={self.num_stages}, "
                f"chunks={self.num_chunks}, ops={len(self)})")

    def to_frame(self) -> pd.DataFrame:
        """One row per op: rank, order (position in the rank's list), kind, stage, way,
        chunk and deps."""
        rows = [
            {"rank": r, "order": i, "kind": op.kind, "stage": op.stage, "way": op.way,
             "chunk": op.chunk, "deps": op.deps}
            for r, ops in enumerate(self.ranks) for i, op in enumerate(ops)
        ]
        columns = ["rank", "order", "kind", "stage", "way", "chunk", "deps"]
        return pd.DataFrame(rows, columns=columns)

    def grid(self) -> list[list[str]]:
        """``grid()[t][r]`` is the label of the op rank ``r`` runs at unit-cost step ``t``
        (``"."`` when idle)."""
        df = simulate(self, 1.0).df
        steps = round(df["end"].max()) if len(df) else 0
        cells = [["."] * self.num_ranks for _ in range(steps)]
        labels = [self.label(op) for op in self.ops()]
        for label, rank, start in zip(labels, df["rank"], df["start"]):
            cells[round(start)][int(rank)] = label
        return cells

    def label(self, op: Op) -> str:
        """``op.label``, plus the rank's virtual-stage letter when stages outnumber ranks."""
        if self.num_stages <= self.num_ranks or op.chunk < 0:
            return op.label
        return op.label + "abcdefghijklmnopqrstuvwxyz"[op.stage // self.num_ranks]

    def __str__(self) -> str:
        cells = self.grid()
        head = ["step"] + [f"r{r}" for r in range(self.num_ranks)]
        body = [[str(t)] + row for t, row in enumerate(cells)]
        widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
        title = (f"{self.name}: {self.num_stages} stages, {self.num_chunks} chunks, "
                 f"{self.num_ranks} ranks")
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
                 for row in [head, *body]]
        return "\n".join([title, *lines])


def check_positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def forward_op(stage: int, chunk: int) -> Op:
    """Forward of ``chunk`` at ``stage``; it needs the previous stage's forward."""
    deps = (("forward", stage - 1, chunk, 0),) if stage > 0 else ()
    return Op(OpKind.FORWARD, stage, chunk, deps=deps)


def backward_op(stage: int, chunk: int, num_stages: int) -> Op:
    """Backward of ``chunk`` at ``stage``; it needs the next stage's backward, or at the
    last stage this stage's own forward (the loss)."""
    if stage == num_stages - 1:
        return Op(OpKind.BACKWARD, stage, chunk, deps=(("forward", stage, chunk, 0),))
    return Op(OpKind.BACKWARD, stage, chunk, deps=(("backward", stage + 1, chunk, 0),))


def weight_op(stage: int, chunk: int) -> Op:
    """Weight gradient of ``chunk`` at ``stage`` (split backward); it needs that backward."""
    return Op(OpKind.WEIGHT, stage, chunk, deps=(("backward", stage, chunk, 0),))
