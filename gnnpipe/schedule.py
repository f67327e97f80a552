"""Pipeline schedules as plain data: GNNPipe's chunked fill-drain, GPipe, 1F1B, interleaved
1F1B (virtual stages) and the zero-bubble ZB-H1 (backward split into input and weight gradient)."""

from __future__ import annotations

import numbers
from collections.abc import Iterator
from dataclasses import dataclass, field

import pandas as pd

#: Key that names an op inside a schedule: ``(kind, stage, chunk, way)``.
OpKey = tuple[str, int, int, int]

#: Op kinds a schedule may hold (``idle`` is a Timeline-only kind). In zero-bubble schedules
#: ``backward`` computes only the input gradient and ``weight`` the weight gradient.
OP_KINDS: tuple[str, ...] = ("forward", "backward", "weight", "send", "recv", "allreduce", "step")

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


def _weight_op(stage: int, chunk: int) -> Op:
    """Weight gradient of ``chunk`` at ``stage`` (split backward); it needs that backward."""
    return Op("weight", stage, chunk, deps=(("backward", stage, chunk, 0),))


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
    ranks = tuple(_one_f_one_b_rank(s, stages, microbatches, step, split=False)
                  for s in range(stages))
    return Schedule("1f1b", stages, microbatches, ranks)


def _one_f_one_b_rank(s: int, stages: int, microbatches: int, step: bool,
                      split: bool) -> tuple[Op, ...]:
    """Rank ``s`` of 1F1B: ``S-s`` warm-up forwards, then one backward and one forward each.
    With ``split`` (ZB-H1) the backward is the input gradient only, and the weight gradient of
    chunk ``c`` follows the backward of chunk ``c+s``; the last ``s`` fill the drain."""
    warmup = min(stages - s, microbatches)
    ops = [forward_op(s, c) for c in range(warmup)]
    for c in range(microbatches):
        ops.append(backward_op(s, c, stages))
        if split and c >= s:
            ops.append(_weight_op(s, c - s))
        if warmup + c < microbatches:
            ops.append(forward_op(s, warmup + c))
    if split:
        ops += [_weight_op(s, c) for c in range(max(microbatches - s, 0), microbatches)]
    if step:
        ops.append(Op("step", s, -1))
    return tuple(ops)


def interleaved_1f1b(stages: int, microbatches: int, virtual: int = 2, *,
                     step: bool = False) -> Schedule:
    """Megatron-LM's interleaved 1F1B: each of the ``S`` ranks holds ``v`` model chunks, so the
    model is cut into ``S·v`` (virtual) stages and stage ``k`` sits on rank ``k mod S``.

    Micro-batches go through in groups of ``S``: a rank's ``k``-th forward is micro-batch
    ``(k // (S·v))·S + k mod S`` on its model chunk ``(k mod S·v) // S``; backwards run the same
    order with the model chunks reversed. Rank ``r`` warms up with ``2(S−1−r) + (v−1)·S``
    forwards (all of them when that reaches ``M·v``), then alternates one forward and one
    backward, then drains. With each virtual-stage op costing ``1/v`` of a full stage's, the
    bubble is ``(S−1)/(v·M + S−1)``: ``v`` times smaller than 1F1B's, for ``v`` times the
    point-to-point messages.

    Args:
        stages: Number of ranks ``S`` (physical pipeline stages).
        microbatches: Number of micro-batches ``M``, a multiple of ``S``.
        virtual: Model chunks per rank ``v``; ``1`` gives 1F1B's op order.
        step: Append one optimizer ``step`` op to each rank.

    Raises:
        ValueError: If an argument is not a positive int, or ``microbatches`` is not a
            multiple of ``stages``.
    """
    ranks_, micro = _check_positive("stages", stages), _check_positive("microbatches", microbatches)
    v = _check_positive("virtual", virtual)
    _check_step(step)
    if micro % ranks_:
        raise ValueError(f"microbatches must be a multiple of stages ({ranks_}), got {micro}")
    total, group = micro * v, ranks_ * v

    def which(k: int, forward: bool) -> tuple[int, int]:
        """(virtual stage index on the rank, micro-batch) of the rank's ``k``-th op."""
        j = (k % group) // ranks_
        return (j if forward else v - 1 - j), (k // group) * ranks_ + k % ranks_

    ranks = []
    for r in range(ranks_):
        warmup = total if micro == ranks_ else min(2 * (ranks_ - 1 - r) + (v - 1) * ranks_, total)
        order = [(True, k) for k in range(warmup)]
        for i in range(total - warmup):
            order += [(True, warmup + i), (False, i)]
        order += [(False, i) for i in range(total - warmup, total)]
        ops = []
        for forward, k in order:
            j, m = which(k, forward)
            stage = j * ranks_ + r
            ops.append(forward_op(stage, m) if forward else backward_op(stage, m, group))
        if step:
            ops.append(Op("step", r, -1))
        ranks.append(tuple(ops))
    return Schedule("interleaved", group, micro, tuple(ranks))


def zb_h1(stages: int, microbatches: int, *, step: bool = False) -> Schedule:
    """ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): 1F1B with each backward split
    into ``backward`` (the input gradient, on the critical path) and ``weight`` (the weight
    gradient, which nothing downstream waits for).

    Rank ``s`` keeps 1F1B's ``min(S−s, M)`` warm-up forwards and its forward/backward order, and
    runs the weight gradient of chunk ``c`` right after the backward of chunk ``c + s``: the last
    stages put off the most ``weight`` ops, and the ``s + 1`` left after rank ``s``'s last
    backward fill the drain. Every rank keeps at most ``S`` chunks' activations (1F1B's peak,
    counted from a forward to its ``weight``). For ``M ≥ S`` and ``T_W ≤ T_B`` each rank idles
    ``(S−1)(T_F + T_B − T_W)`` (the paper's ZB-H1 bubble; with its ``T_F = T_B = T_W`` a third of
    1F1B's ``(S−1)(T_F + T_B + T_W)``), so the bubble is
    ``(S−1)(T_F+T_B−T_W) / (M(T_F+T_B+T_W) + (S−1)(T_F+T_B−T_W))``.

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
    ranks = tuple(_one_f_one_b_rank(s, stages, microbatches, step, split=True)
                  for s in range(stages))
    return Schedule("zb-h1", stages, microbatches, ranks)
