"""Pipeline schedules as plain data: GNNPipe's chunked fill-drain, GPipe and 1F1B."""

from __future__ import annotations

import numbers
from collections.abc import Iterator
from dataclasses import dataclass, field

import pandas as pd

#: Key that names an op inside a schedule: ``(kind, stage, chunk, way)``.
OpKey = tuple[str, int, int, int]

#: Op kinds a schedule may hold (``idle`` is a Timeline-only kind).
OP_KINDS: tuple[str, ...] = ("forward", "backward", "send", "recv", "allreduce", "step")

#: One-letter labels used by the step × rank grid.
LABELS: dict[str, str] = {
    "forward": "F", "backward": "B", "send": "s", "recv": "r", "allreduce": "A", "step": "S",
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

    kind: str
    stage: int
    chunk: int
    way: int = 0
    deps: tuple[OpKey, ...] = ()

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
    (``F3`` forward of chunk 3, ``B3`` its backward, ``S`` optimizer step, ``.`` idle).
    """

    name: str
    num_stages: int
    num_chunks: int
    ranks: tuple[tuple[Op, ...], ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", tuple(tuple(ops) for ops in self.ranks))
        _check_positive("num_stages", self.num_stages)
        _check_positive("num_chunks", self.num_chunks)
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
        from gnnpipe.simulate import simulate  # lazy: simulate depends on this module

        df = simulate(self, 1.0).df
        steps = round(df["end"].max()) if len(df) else 0
        cells = [["."] * self.num_ranks for _ in range(steps)]
        labels = [op.label for op in self.ops()]
        for label, rank, start in zip(labels, df["rank"], df["start"]):
            cells[round(start)][int(rank)] = label
        return cells

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


def _check_positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def forward_op(stage: int, chunk: int) -> Op:
    """Forward of ``chunk`` at ``stage``; it needs the previous stage's forward."""
    deps = (("forward", stage - 1, chunk, 0),) if stage > 0 else ()
    return Op("forward", stage, chunk, deps=deps)


def backward_op(stage: int, chunk: int, num_stages: int) -> Op:
    """Backward of ``chunk`` at ``stage``; it needs the next stage's backward, or at the
    last stage this stage's own forward (the loss)."""
    if stage == num_stages - 1:
        return Op("backward", stage, chunk, deps=(("forward", stage, chunk, 0),))
    return Op("backward", stage, chunk, deps=(("backward", stage + 1, chunk, 0),))


def _check_step(step: object) -> None:
    if not isinstance(step, bool):
        raise TypeError(f"step: expected True or False, got {step!r}")


def _fill_drain(name: str, stages: int, chunks: int, step: bool) -> Schedule:
    _check_step(step)
    ranks = []
    for s in range(stages):
        ops = [forward_op(s, c) for c in range(chunks)]
        ops += [backward_op(s, c, stages) for c in reversed(range(chunks))]
        if step:
            ops.append(Op("step", s, -1))
        ranks.append(tuple(ops))
    return Schedule(name, stages, chunks, tuple(ranks))


def gnnpipe(stages: int, chunks: int, *, step: bool = False) -> Schedule:
    """GNNPipe's chunked fill-drain: one rank per stage; every rank runs the forward of
    chunks ``0..C-1`` in order, then their backward in reverse order ``C-1..0``.

    With equal op costs each rank idles ``(S-1)/(C+S-1)`` of the makespan.

    Args:
        stages: Number of pipeline stages (= ranks), ``S``.
        chunks: Number of graph chunks per epoch, ``C``.
        step: Append one optimizer ``step`` op to each rank (one step per epoch).

    Raises:
        ValueError: If ``stages`` or ``chunks`` is not a positive int.
    """
    stages = _check_positive("stages", stages)
    chunks = _check_positive("chunks", chunks)
    return _fill_drain("gnnpipe", stages, chunks, step)


def gpipe(stages: int, microbatches: int, *, step: bool = False) -> Schedule:
    """GPipe: forward of all micro-batches in order, then backward in **reverse** order
    (``M-1..0``, as autograd unwinds them in torchgpipe).

    The op order equals :func:`gnnpipe`'s; the difference is in what flows: GPipe's
    micro-batches are independent samples, GNNPipe's chunks share historical embeddings.

    Args:
        stages: Number of pipeline stages (= ranks), ``S``.
        microbatches: Number of micro-batches, ``M``.
        step: Append one optimizer ``step`` op to each rank.

    Raises:
        ValueError: If ``stages`` or ``microbatches`` is not a positive int.
    """
    stages = _check_positive("stages", stages)
    microbatches = _check_positive("microbatches", microbatches)
    return _fill_drain("gpipe", stages, microbatches, step)


def one_f_one_b(stages: int, microbatches: int, *, step: bool = False) -> Schedule:
    """PipeDream-flush 1F1B: rank ``s`` runs ``min(S-s, M)`` warm-up forwards, then
    alternates one backward and one forward, then drains the remaining backwards.

    Backwards run in micro-batch order ``0..M-1``; rank ``s`` keeps at most ``S-s``
    micro-batches' activations alive, against ``M`` for GPipe.

    Args:
        stages: Number of pipeline stages (= ranks), ``S``.
        microbatches: Number of micro-batches, ``M``.
        step: Append one optimizer ``step`` op to each rank.

    Raises:
        ValueError: If ``stages`` or ``microbatches`` is not a positive int.
    """
    stages = _check_positive("stages", stages)
    microbatches = _check_positive("microbatches", microbatches)
    _check_step(step)
    ranks = []
    for s in range(stages):
        warmup = min(stages - s, microbatches)
        ops = [forward_op(s, c) for c in range(warmup)]
        for c in range(microbatches):
            ops.append(backward_op(s, c, stages))
            if warmup + c < microbatches:
                ops.append(forward_op(s, warmup + c))
        if step:
            ops.append(Op("step", s, -1))
        ranks.append(tuple(ops))
    return Schedule("1f1b", stages, microbatches, tuple(ranks))
