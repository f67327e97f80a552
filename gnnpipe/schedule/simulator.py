"""Discrete-event simulation of a Schedule with op costs, giving a predicted Timeline."""

from __future__ import annotations

import math
import numbers
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol, TypeVar, runtime_checkable

import pandas as pd

from gnnpipe.core.timeline import COLUMNS, SCHEDULE_KINDS, Timeline

__all__ = ["Costs", "simulate"]

#: Key that names an op inside a schedule: ``(kind, stage, chunk, way)``.
OpKey = tuple[str, int, int, int]


class _Op(Protocol):
    """What the simulator reads of an op (:class:`gnnpipe.schedule.Op`), read-only."""

    @property
    def kind(self) -> str: ...

    @property
    def stage(self) -> int: ...

    @property
    def chunk(self) -> int: ...

    @property
    def way(self) -> int: ...

    @property
    def deps(self) -> tuple[OpKey, ...]: ...

    @property
    def key(self) -> OpKey: ...


#: The op type of a schedule, so that a cost function may take the schedule's own ops.
OpT = TypeVar("OpT", bound=_Op)
OpT_co = TypeVar("OpT_co", bound=_Op, covariant=True)


@runtime_checkable
class _Schedule(Protocol[OpT_co]):
    """What the simulator reads of a schedule (:class:`gnnpipe.schedule.Schedule`): the
    simulator sits below the schedules, which render themselves by simulating."""

    @property
    def name(self) -> str: ...

    @property
    def ranks(self) -> tuple[tuple[OpT_co, ...], ...]: ...

    @property
    def num_ranks(self) -> int: ...

    def ops(self) -> Iterator[OpT_co]: ...

#: Op costs in seconds: one number, a mapping keyed by ``kind``, ``(kind, stage)`` or
#: ``(kind, stage, chunk)`` (most specific wins), or a callable ``op -> seconds``.
Costs = float | Mapping[object, float] | Callable[[OpT], float]


def simulate(schedule: _Schedule[OpT], costs: Costs[OpT],
             comm: float | None = None) -> Timeline:
    """Predict when every op of ``schedule`` runs.

    Each rank runs its ops in list order; an op starts at the latest of the time its
    rank becomes free and the end of each of its dependencies, plus ``comm`` seconds for
    a dependency on an op of another rank (the implicit send/recv between stages).

    Args:
        schedule: The schedule to run.
        costs: Seconds per op (see :data:`Costs`), e.g. ``{"forward": 1, "backward": 2}``.
        comm: Transfer delay in seconds on every cross-rank dependency; ``None`` for 0.

    Returns:
        A Timeline with one row per op (rank = the op list it sits in, epoch 0,
        bytes 0, peer -1), rows in rank order then run order.

    Raises:
        TypeError: If ``schedule`` is not a Schedule, or ``costs`` or ``comm`` (or a cost)
            is not a number where one is due.
        ValueError: On a missing, negative or non-finite cost, a costs key naming no op kind,
            a negative ``comm``, or a
            schedule that cannot progress (a dependency cycle or an op waiting for a
            later one).
    """
    if not isinstance(schedule, _Schedule):
        raise TypeError(f"schedule: expected a gp.schedule Schedule (gp.schedule.gnnpipe(...) "
                        f"etc.), got {type(schedule).__name__}")
    cost_of = _cost_function(costs)
    delay = _check_seconds("comm", 0.0 if comm is None else comm)
    ops = list(schedule.ops())
    rank_of = [r for r, rank_ops in enumerate(schedule.ranks) for _ in rank_ops]
    index: dict[tuple[object, ...], int] = {op.key: i for i, op in enumerate(ops)}
    preds: list[list[int]] = [[index[tuple(d)] for d in op.deps] for op in ops]
    prev_on_rank = [i - 1 if i > 0 and rank_of[i - 1] == rank_of[i] else -1
                    for i in range(len(ops))]
    waiting = [len(p) + (prev_on_rank[i] >= 0) for i, p in enumerate(preds)]
    succs: list[list[int]] = [[] for _ in ops]
    for i, p in enumerate(preds):
        for j in p:
            succs[j].append(i)
        if prev_on_rank[i] >= 0:
            succs[prev_on_rank[i]].append(i)

    start = [math.nan] * len(ops)
    end = [math.nan] * len(ops)
    ready = deque(i for i, w in enumerate(waiting) if w == 0)
    while ready:
        i = ready.popleft()
        t = end[prev_on_rank[i]] if prev_on_rank[i] >= 0 else 0.0
        for j in preds[i]:
            t = max(t, end[j] + (delay if rank_of[j] != rank_of[i] else 0.0))
        start[i], end[i] = t, t + cost_of(ops[i])
        for k in succs[i]:
            waiting[k] -= 1
            if waiting[k] == 0:
                ready.append(k)
    if any(math.isnan(e) for e in end):
        raise ValueError(_deadlock_message(schedule, ops, rank_of, end, index))
    frame = pd.DataFrame({
        "rank": rank_of, "stage": [op.stage for op in ops], "way": [op.way for op in ops],
        "chunk": [op.chunk for op in ops], "epoch": 0, "kind": [op.kind for op in ops],
        "start": start, "end": end, "bytes": 0, "peer": -1,
    }, columns=list(COLUMNS))
    return Timeline(frame)


def _deadlock_message(schedule: _Schedule[OpT], ops: list[OpT], rank_of: list[int],
                      end: list[float], index: dict[tuple[object, ...], int]) -> str:
    """Describe, per stuck rank, the first op it cannot run and what that op waits for."""
    stuck = []
    for r in range(schedule.num_ranks):
        pending = [i for i, rk in enumerate(rank_of) if rk == r and math.isnan(end[i])]
        if not pending:
            continue
        op = ops[pending[0]]
        unmet = [tuple(d) for d in op.deps if math.isnan(end[index[tuple(d)]])]
        stuck.append(f"rank {r} is stuck at {op.key} waiting for {unmet}")
    return f"schedule {schedule.name!r} cannot progress (deadlock): " + "; ".join(stuck)


def _check_seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
    return value


def _check_kinds(table: dict) -> None:
    """Every key names a schedule op kind: a misspelt ``"forwrd"`` would only ever be ignored."""
    for key in table:
        kind = key[0] if isinstance(key, tuple) and key else key
        if kind not in SCHEDULE_KINDS:
            raise ValueError(f"costs: key {key!r} names no op kind; expected keys kind, "
                             f"(kind, stage) or (kind, stage, chunk) with kind one of {SCHEDULE_KINDS}")


def _cost_function(costs: Costs[OpT]) -> Callable[[OpT], float]:
    """Turn ``costs`` into a checked ``op -> seconds`` function."""
    if isinstance(costs, numbers.Real) and not isinstance(costs, bool):
        seconds = _check_seconds("costs", costs)
        return lambda op: seconds
    if isinstance(costs, Mapping):
        table = dict(costs)
        _check_kinds(table)

        def lookup(op: OpT) -> float:
            for key in ((op.kind, op.stage, op.chunk), (op.kind, op.stage), op.kind):
                if key in table:
                    return _check_seconds(f"costs[{key!r}]", table[key])
            raise ValueError(
                f"costs has no entry for op {op.key}: give {op.kind!r}, "
                f"{(op.kind, op.stage)!r} or {(op.kind, op.stage, op.chunk)!r}")
        return lookup
    if callable(costs):
        return lambda op: _check_seconds(f"costs({op.key})", costs(op))
    raise TypeError(
        f"costs must be a number, a mapping or a callable op -> seconds, got {type(costs).__name__}")
